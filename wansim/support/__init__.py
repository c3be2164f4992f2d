"""Process plumbing with no physics: lazy package exports and the test-only pause point."""
