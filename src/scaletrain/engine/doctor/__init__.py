"""The failure doctor: log signatures, the first failure of a dead run, its summary, and the fixes to offer."""
