"""The report page in a real browser (issue 50): headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium) opens the tiny pipeline's report/index.html at 1400 px wide: no console error, every image
loaded, and every figure legible — shown at half its pixels or more, or, for a grid wider than the page, at full
size after a click (and fitted again after a second). Screenshots go to $LAYERSIM_ARTIFACTS/browser (default: a
folder of the test's tmp_path). A planted broken image must be caught, so the check itself is tested.

`.ci/run` installs the browser and sets LAYERSIM_REQUIRE_BROWSER=1, which turns a missing browser into a failure
rather than a skip."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from dvc_project import built_project
from test_dvc_workflows import _configure  # the same tiny project, built once per test run

pytestmark = pytest.mark.integration
WIDTH = 1400
LEGIBLE = 0.5  # rendered / natural width at which the figures' 6-7 pt labels stay readable


def _driver():
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        why = f"the browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("LAYERSIM_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={WIDTH},1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


@pytest.fixture(scope="module")
def browser():
    driver = _driver()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory, built_projects) -> Path:
    root = tmp_path_factory.mktemp("browser") / "project"
    built_project(built_projects, root, _configure, "workflows")
    return root / "report" / "index.html"


def page_problems(driver, page: Path, shots: Path) -> list[str]:
    """Everything wrong with `page` as the browser shows it; screenshots of it into `shots`."""
    from selenium.webdriver.common.by import By

    driver.get(page.resolve().as_uri())
    problems = [f"console: {entry['message']}" for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    images = driver.find_elements(By.CSS_SELECTOR, "img")
    if not images:
        problems.append("the page shows no image")
    for k, image in enumerate(images):
        natural, rendered = (driver.execute_script("return [arguments[0].naturalWidth, arguments[0].clientWidth]",
                                                   image))
        if not driver.execute_script("return arguments[0].complete", image) or natural == 0:
            problems.append(f"image {k} did not load")
            continue
        if rendered / natural >= LEGIBLE:
            continue
        labels = image.find_elements(By.XPATH, "./ancestor::label")
        if not labels:
            problems.append(f"image {k} is shown at {rendered / natural:.2f} of its width and cannot be enlarged")
            continue
        label = labels[0]
        driver.execute_script("arguments[0].scrollIntoView()", label)
        label.click()
        zoomed = driver.execute_script("return arguments[0].clientWidth", image)
        if zoomed < 0.95 * natural:
            problems.append(f"image {k} is shown at {rendered / natural:.2f} of its width and {zoomed / natural:.2f} "
                            "after a click")
        elif k == 0 or not any(p.startswith("zoomed") for p in problems):
            driver.save_screenshot(str(shots / f"{page.stem}-zoomed-{k}.png"))
        label.click()
        if driver.execute_script("return arguments[0].clientWidth", image) != rendered:
            problems.append(f"image {k} did not fit the page again after a second click")
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(WIDTH, min(height + 200, 16000))
    driver.save_screenshot(str(shots / f"{page.stem}.png"))
    driver.set_window_size(WIDTH, 1000)
    return problems


def test_the_report_shows_every_figure_legibly(browser, report, tmp_path):
    shots = Path(os.environ.get("LAYERSIM_ARTIFACTS", tmp_path)) / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    assert page_problems(browser, report, shots) == []
    assert (shots / "index.png").stat().st_size > 10_000


def test_a_broken_image_is_caught(browser, report, tmp_path):
    planted = tmp_path / "planted.html"
    text = report.read_text(encoding="utf-8")
    planted.write_text(re.sub(r'src="data:image/png;base64,[^"]*"', 'src="data:image/png;base64,AAAA"', text,
                              count=1), encoding="utf-8")
    assert page_problems(browser, planted, tmp_path) [:1] == ["image 0 did not load"]
