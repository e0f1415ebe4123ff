"""The randomized fault test of issue 28: tests/chaos/driver.py (run it with
``python -m tests.chaos``; tests/integration/test_chaos.py runs short ones)."""
