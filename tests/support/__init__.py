"""Test support code shared by several test modules (tests/conftest.py puts tests/ on sys.path, so
`from support.datahub_standin import StandInDataHub` works from any test)."""
