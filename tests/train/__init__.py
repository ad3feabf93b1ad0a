"""The training-plane tests: a package, so that the package-scoped fixtures of conftest.py (an embedded Ray, one
torch thread) end with these tests instead of living on through the rest of the session."""
