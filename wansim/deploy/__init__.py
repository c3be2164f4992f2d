"""Deployments as users describe them: nodes, regions, memory, partition, ring, cost, plan."""
