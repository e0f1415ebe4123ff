"""Headless Chromium for the web UI's browser tests (selenium driving Debian's chromium).

``browser`` skips the test with a clear message where the browser, its driver or selenium
is missing (``make system-deps`` installs chromium and chromium-driver when root). Pages
are waited for with deadlines (WebDriverWait), never with sleeps. ``shot`` writes a
screenshot of the page as a test artifact under build/ui-screenshots/ (not committed).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess

CHROMIUM = os.environ.get("AMQPD_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AMQPD_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui-screenshots"
WAIT = 15.0


def missing_browser() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)) and not shutil.which(path):
            return f"{path} not found: install Debian's {pkg} (make system-deps does, as root)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = missing_browser()
    if reason:
        pytest.skip(f"web UI browser tests need headless Chromium: {reason}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--disable-extensions", "--no-first-run",
                "--disable-background-networking"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def module_broker(factory: pytest.TempPathFactory,
                  env: dict[str, str]) -> Iterator[BrokerProcess]:
    """The body of a test module's ``broker`` fixture: one amqpd with ``env``."""
    proc = BrokerProcess(factory.mktemp("amqpd"), env=env)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    """The HTTP API of the module's ``broker`` (a fixture the test module defines)."""
    return Api(broker.http_url)


@pytest.fixture
def ui(browser: Any, broker: BrokerProcess) -> Any:
    """The browser, logged in to the module's broker as guest."""
    login(browser, broker.http_url)
    return browser


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def open_link(driver: Any, css: str, text: str) -> None:
    """Click the link among ``css`` whose text is ``text``."""
    next(a for a in driver.find_elements("css selector", css) if a.text == text).click()


def wait(driver: Any, check: Callable[[Any], Any], timeout: float = WAIT,
         what: str = "the page") -> Any:
    """Poll ``check(driver)`` until it returns something truthy, or fail saying what."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d: Any) -> Any:
        try:
            return check(d)
        except StaleElementReferenceException:
            return False  # the page redrew under us: look again

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(safe)
    except TimeoutException:
        body = driver.find_element("tag name", "body").text[:1500]
        raise AssertionError(f"timed out waiting for {what}; the page shows:\n{body}") from None


def text_of(driver: Any, css: str) -> str:
    els = driver.find_elements("css selector", css)
    return els[0].text if els else ""


def wait_text(driver: Any, css: str, needle: str, timeout: float = WAIT) -> str:
    return wait(driver, lambda d: needle in text_of(d, css) and text_of(d, css), timeout,
                f"{needle!r} in {css}")


def fill(driver: Any, form_css: str, values: dict[str, Any]) -> None:
    """Set a form's fields by name: text and selects, and checkboxes from a bool."""
    from selenium.webdriver.support.ui import Select

    form = driver.find_element("css selector", form_css)
    for name, value in values.items():
        el = form.find_element("css selector", f"[name='{name}']")
        if el.tag_name == "select":
            Select(el).select_by_value(str(value))
        elif el.get_attribute("type") == "checkbox":
            if el.is_selected() != bool(value):
                el.click()
        else:
            if el.get_attribute("type") != "file":
                el.clear()
            el.send_keys(str(value))


def submit(driver: Any, form_css: str, expect: str, timeout: float = WAIT) -> str:
    """Submit a form and wait for its status line to say ``expect``."""
    driver.find_element("css selector", f"{form_css} button[type=submit]").click()
    return wait_text(driver, f"{form_css} .form-status", expect, timeout)


def login(driver: Any, base: str, user: str = "guest", password: str = "guest") -> None:
    driver.get(base + "/#/")
    wait(driver, lambda d: d.find_elements("css selector", "#login-form, #nav a"),
         what="the login form or the navigation")
    if driver.find_elements("css selector", "#nav a"):
        driver.find_element("css selector", "#whoami button").click()  # someone else
        wait(driver, lambda d: d.find_elements("css selector", "#login-form"),
             what="the login form")
    fill(driver, "#login-form", {"username": user, "password": password})
    driver.find_element("css selector", "#login-form button[type=submit]").click()
    wait_text(driver, "#whoami", user)


def go(driver: Any, base: str, hash_path: str, ready_css: str) -> None:
    driver.get(f"{base}/#/{hash_path}")
    wait(driver, lambda d: d.find_elements("css selector", ready_css), what=ready_css)


def shot(driver: Any, name: str, full: bool = True) -> Path:
    """The whole page (up to 4000 px tall) as build/ui-screenshots/<name>.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    size = driver.get_window_size()
    if full:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], min(max(int(height) + 20, 600), 4000))
    try:
        driver.save_screenshot(str(path))
    finally:
        if full:
            driver.set_window_size(size["width"], size["height"])
    return path


def page_errors(driver: Any) -> list[str]:
    """Messages of a page that failed to render (the app shows them in main)."""
    return [e.text for e in driver.find_elements("css selector", "main > .panel.form-status.error")]


class Publisher(threading.Thread):
    """Publishes with confirms until stopped (bounded in time and count): to ``queue``
    through the default exchange (declared, and drained now and then), or with
    ``exchange``, to that exchange (routing key ``queue``). ``label`` is the connection's
    ``connection_name``, so a page can find it."""

    def __init__(self, url: str, queue: str, exchange: str = "",
                 label: str | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.exchange, self.label = url, queue, exchange, label
        self.halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        params = pika.URLParameters(self.url)
        if self.label:
            params.client_properties = {"connection_name": self.label}
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            if not self.exchange:
                ch.queue_declare(self.queue)
            ch.confirm_delivery()
            deadline = time.monotonic() + 60
            while not self.halt.is_set() and time.monotonic() < deadline and self.sent < 10**6:
                ch.basic_publish(self.exchange, self.queue, b"tick")
                self.sent += 1
                if self.sent % 50 == 0:
                    if not self.exchange:
                        ch.basic_get(self.queue, auto_ack=True)
                    conn.sleep(0.005)  # a steady rate, not a flood
        finally:
            conn.close()
