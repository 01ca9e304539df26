"""The web page end to end in headless Chromium: a fake microphone plays a recorded question,
the page streams it to the server, shows the transcript, then the answer with its speed.

Needs Debian's `chromium` and `chromium-driver` (`make test` installs them where it can);
skipped, with the reason shown, where they are missing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgestream.serve.app import ServerSettings

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
SAMPLE = Path(__file__).parents[2] / "edgestream/asr/samples/why-is-the-sky-blue.wav"
TOKEN = "browser-test-token"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Chromium or ChromeDriver missing: apt-get install chromium chromium-driver",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",  # this machine's network is closed: no lookups
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",  # grant the microphone without a prompt
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={SAMPLE}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _text_of(browser: object, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id).text.strip()


def test_speak_see_the_transcript_then_the_answer(
    browser: object, serve: Callable[..., object], assistant: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def text_of(element_id: str) -> str:
        return _text_of(browser, element_id)

    with serve(assistant, ServerSettings(token=TOKEN)) as address:
        browser.get(f"http://{address}/?token={TOKEN}")
        browser.find_element(By.ID, "start").click()
        # The partial transcript appears while the fake microphone is still playing.
        WebDriverWait(browser, 30).until(lambda _: text_of("transcript"))
        WebDriverWait(browser, 30).until(lambda _: "why" in text_of("transcript"))
        browser.find_element(By.ID, "stop").click()
        WebDriverWait(browser, 60).until(lambda _: "tokens/s" in text_of("speed"))
        transcript, answer = text_of("transcript"), text_of("answer")
        status = browser.find_element(By.ID, "status")
        logs = browser.get_log("browser")
    assert transcript.startswith("why"), transcript
    # What the page shows is what the assistant answers to that transcript (greedy: exact).
    assert answer == assistant.answer(transcript, "ss").text.strip()
    assert "error" not in status.get_attribute("class"), status.text
    assert "real time" in status.text
    assert not [entry for entry in logs if entry["level"] == "SEVERE"], logs


def test_hands_free_each_question_is_answered_when_the_speaker_pauses(
    browser: object, serve: Callable[..., object], assistant: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serve(assistant, ServerSettings(token=TOKEN)) as address:
        browser.get(f"http://{address}/?token={TOKEN}")
        for button in ("handsfree", "start"):
            browser.find_element(By.ID, button).click()
        # No Stop: the fake microphone goes silent after the question, the endpoint closes
        # the segment, and the page answers it while the microphone stays open.
        WebDriverWait(browser, 60).until(lambda _: "tokens/s" in _text_of(browser, "speed"))
        question, answer = _text_of(browser, "question"), _text_of(browser, "answer")
        still_listening = browser.find_element(By.ID, "stop").is_enabled()
        browser.find_element(By.ID, "stop").click()
        logs = browser.get_log("browser")
    assert question.startswith("why"), question
    assert answer == assistant.answer(question, "ss").text.strip()
    assert still_listening
    assert not [entry for entry in logs if entry["level"] == "SEVERE"], logs
