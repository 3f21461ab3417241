"""Helpers of the tests, not tests: imported as `support.<module>` (tests/ is on the path, as the folder
of conftest.py) or run by path (the fork server, Ray's head and driver)."""
