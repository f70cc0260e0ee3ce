"""Fixtures of the console's browser suite: the SDK suite's mock provider and `recovea serve`
(tests/sdk/conftest.py, loaded under another name), and a headless Chromium driven over WebDriver."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Iterable

import pytest

_SDK_CONFTEST = Path(__file__).resolve().parents[1] / "sdk" / "conftest.py"
_spec = importlib.util.spec_from_file_location("recovea_sdk_conftest", _SDK_CONFTEST)
assert _spec and _spec.loader
sdk = importlib.util.module_from_spec(_spec)
sys.modules["recovea_sdk_conftest"] = sdk
_spec.loader.exec_module(sdk)

# The session fixtures this suite shares with the SDK suite: one mock provider, one gateway.
mock_provider = sdk.mock_provider
gateway = sdk.gateway
admin = sdk.admin
pytest_terminal_summary = sdk.pytest_terminal_summary

from webdriver import Browser, Driver  # noqa: E402


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Iterable[Driver]:
    d = Driver(tmp_path_factory.mktemp("chromedriver") / "chromedriver.log")
    yield d
    d.close()


@pytest.fixture
def browser(driver: Driver) -> Iterable[Browser]:
    b = driver.browser()
    yield b
    b.quit()
