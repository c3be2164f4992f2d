"""Serving many users: the workload (arrivals, lengths, mixes, trace files) and the
micro-batched pipeline rules both engines share."""
