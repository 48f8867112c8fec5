"""The report page and `dvc plots show`'s page in a real browser (issue 50): headless Chromium (Debian's `chromium`
and `chromium-driver`, driven by Selenium) opens the tiny pipeline's report/index.html at 1400 px wide: no console
error, every image loaded, and every figure legible — shown at half its pixels or more, or, for a grid wider than
the page, at full size after a click (and fitted again after a second); and the page `dvc plots show` renders:
no console error, and every Vega plot drew marks (coloured pixels beyond the grey axes). Screenshots go to
$LAYERSIM_ARTIFACTS/browser (default: a folder of the test's tmp_path). A planted broken image and a planted empty
plot must be caught, so the checks themselves are tested.

`.ci/run` installs the browser and sets LAYERSIM_REQUIRE_BROWSER=1, which turns a missing browser into a failure
rather than a skip."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from dvc_project import built_project, configure_workflows

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
def built(tmp_path_factory, built_projects) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("browser") / "project"
    env, _ = built_project(built_projects, root, configure_workflows, "workflows")
    return root, env


@pytest.fixture(scope="module")
def report(built) -> Path:
    return built[0] / "report" / "index.html"


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


# Installed before the page's scripts run: every vegaEmbed call keeps its view, so that the test can count what each
# plot drew in Vega's own scene graph (data marks, not axes or legends).
_KEEP_VIEWS = """
window.__views = [];
Object.defineProperty(window, 'vegaEmbed', {configurable: true,
  set(embed) { this.__embed = (el, spec, ...rest) => embed(el, spec, ...rest).then(r => {
    window.__views.push([el, r.view, spec]); return r; }); },
  get() { return this.__embed; }});"""
# Per plot: the items of its data marks (role "mark": lines, points, bars, cells; axes and legends have their own
# roles), counted through the scene graph's nested groups; its line items; and, for a curve file (rows that name
# their `series`), how many (series, experiment) pairs its rows hold.
_MARKS = """
function count(node) {
  let n = 0;
  for (const item of (node.items || [])) {
    if (node.marktype === 'group' || item.items) n += count(item);
    else if (node.role === 'mark' && node.marktype !== 'text') n += 1;
  }
  return n;
}
function lines(node) {  // a line mark's items are its points: one drawn line is one line mark with items
  let n = node.marktype === 'line' && (node.items || []).length ? 1 : 0;
  for (const item of (node.items || [])) if (item.items) n += lines(item);
  return n;
}
function series(spec) {
  const rows = ((spec || {}).data || {}).values || [];
  if (!rows.length || !('series' in rows[0])) return null;
  return new Set(rows.map(row => row.series + '\u0000' + row.rev)).size;
}
return window.__views.map(([el, view, spec]) => [el, count(view.scenegraph().root), lines(view.scenegraph().root),
                                                  series(typeof spec === 'string' ? JSON.parse(spec) : spec)]);"""


def plots_problems(driver, page: Path, shots: Path) -> list[str]:
    """Everything wrong with `dvc plots show`'s page: console errors, and Vega plots that drew no marks."""
    import time

    script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _KEEP_VIEWS})
    try:
        driver.get(page.resolve().as_uri())
        expected = page.read_text(encoding="utf-8").count("vegaEmbed('#")  # one call per plot (the library aside)
        end = time.monotonic() + 30
        while time.monotonic() < end and len(driver.execute_script(_MARKS)) < expected:
            time.sleep(0.5)
        drawn = driver.execute_script(_MARKS)
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", script)
    problems = [f"console: {entry['message']}" for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    if len(drawn) < expected:
        problems.append(f"{len(drawn)} of {expected} Vega plots rendered")
    problems += [f"plot {name} drew no marks" for name, marks, _, _ in drawn if marks == 0]
    # A curve file (the layer_series template) draws one line per series and experiment, not one zig-zag.
    problems += [f"plot {name} drew {lines} lines for {series} series" for name, marks, lines, series in drawn
                 if series is not None and lines != series]
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(WIDTH, min(height + 200, 16000))
    driver.save_screenshot(str(shots / f"{page.parent.name}.png"))
    driver.set_window_size(WIDTH, 1000)
    return problems


@pytest.fixture(scope="module")
def plots_page(built, tmp_path_factory) -> Path:
    from dvc_project import dvc, run

    root, env = built
    out = tmp_path_factory.mktemp("plots") / "dvc-plots"
    run(dvc("plots", "show", "-o", str(out)), root, env)
    return out / "index.html"


def test_dvc_plots_show_draws_every_plot_with_one_line_per_series(browser, plots_page, tmp_path):
    """No console error, no empty plot (the details files, for reading, are no plots: cached outputs), and every
    curve file drawn as one line per series (the layer_series template), not one zig-zag through all of them."""
    shots = Path(os.environ.get("LAYERSIM_ARTIFACTS", tmp_path)) / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    assert plots_problems(browser, plots_page, shots) == []
    text = plots_page.read_text(encoding="utf-8")
    assert text.count('"field": "series"') >= 6  # the curve files: truncation, diagonals, localization, ...


def test_curves_joined_into_one_line_are_caught(browser, plots_page, tmp_path):
    """The issue's zig-zag: a curve file drawn without its series field joins every series into one line."""
    planted = plots_page.parent / "planted-series.html"
    planted.write_text(plots_page.read_text(encoding="utf-8").replace('"field": "series"', '"field": "no_series"'),
                       encoding="utf-8")
    problems = plots_problems(browser, planted, tmp_path)
    assert problems and all(re.fullmatch(r"plot #\S+ drew \d+ lines for \d+ series", p) for p in problems), problems


def test_an_empty_plot_is_caught(browser, plots_page, tmp_path):
    """A plot whose rows lack its y field (as the pruning plots' did) draws axes and no marks."""
    text = plots_page.read_text(encoding="utf-8")
    planted = plots_page.parent / "planted.html"
    # The first per-layer similarity plot's y field renamed: its rows no longer hold it.
    first = re.search(r'"field": "similarity"', text)
    assert first, "the page has no similarity plot to plant an empty one in"
    planted.write_text(text.replace('"field": "similarity"', '"field": "no_such_field"'), encoding="utf-8")
    problems = plots_problems(browser, planted, tmp_path)
    assert [p for p in problems if p.endswith("drew no marks")], problems
