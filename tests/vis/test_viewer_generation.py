"""The viewer of a generation: step pages, tokens, a site over the steps (checked against torch
on each step's saved value), bad input, the server, and the page in a real browser."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

import torchlog
from tests.torchlog.generation.decoding import tiny_gpt2
from tests.vis.browser import start_browser, wait_for
from torchlog.errors import (
    InvalidArgumentTypeError, InvalidOptionError, LayerNotFoundError, StepNotFoundError, TorchlogError,
)
from torchlog.generation import GenerationHistory
from torchlog.vis.viewer import generation, generation_html, serve_generation, show, to_html
from torchlog.vis.viewer.step_sites import site_series

SITE = "transformer.h.1"
NUM_STEPS = 5


def _letters(ids: list[int]) -> str:
    return "".join(chr(65 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def gen() -> GenerationHistory:
    model, prompt = tiny_gpt2(seed=5)  # a seed whose greedy tokens change: 87 87 87 51 51
    found = torchlog.log_generation(model, prompt, max_new_tokens=NUM_STEPS, do_sample=False)
    assert found.num_steps == NUM_STEPS and len(set(found.tokens.reshape(-1).tolist())) > 1
    return found


def _oracle(gen: GenerationHistory, site: str) -> list[dict[str, float]]:
    """Mean, population std, min and max of the site's saved value at each step, by torch."""
    found = []
    for k in range(gen.num_steps):
        value = gen.steps[k][site].tensor_contents.double()
        found.append({"mean": value.mean().item(), "std": value.std(unbiased=False).item(),
                      "min": value.min().item(), "max": value.max().item()})
    return found


def _script(page: str, name: str) -> Any:
    found = re.search(rf'<script id="{name}" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_page_holds_each_step_and_its_tokens(gen) -> None:
    page = generation_html(gen, token_text=_letters)
    data = _script(page, "torchlog-generation")
    assert [s["name"] for s in data["steps"]] == ["prefill"] + [f"step {k}" for k in range(1, NUM_STEPS)]
    for k, entry in enumerate(data["steps"]):
        assert entry["read"]["ids"] == gen.input_ids(k).tolist()
        assert entry["chosen"]["ids"] == [gen.token(k).tolist()]
        assert entry["chosen"]["text"] == [_letters(gen.token(k).tolist())]
        step = _script(page, f"torchlog-step-{k}")  # the step's own page data, as page_html holds it
        assert [(p["label"], p["shape"]) for p in step["passes"]] == [(r.label, list(r.shape)) for r in gen.steps[k]]
    assert data["steps"][0]["read"]["length"] == gen.prompt.shape[-1] and data["steps"][1]["read"]["length"] == 1
    assert SITE in data["sites"] and "served" in data and data["served"] is False


def test_a_site_over_the_steps_equals_torch(gen) -> None:
    series = site_series(gen, SITE)
    assert series["labels"] == [gen.steps[k][SITE].label for k in range(NUM_STEPS)]
    for got, expected in zip(series["stats"], _oracle(gen, SITE)):
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    data = _script(generation_html(gen), "torchlog-generation")  # the written page: the same figures
    page_series = [data["stats"][k][label] for k, label in enumerate(data["where"][SITE])]
    assert page_series == series["stats"]


def test_an_unsaved_site_says_why() -> None:
    model, prompt = tiny_gpt2(seed=5)
    unsaved = torchlog.log_generation(model, prompt, max_new_tokens=2, do_sample=False, layers_to_save=[SITE],
                                     keep_unsaved_layers=True)
    other = "transformer.h.0"
    assert site_series(unsaved, other)["stats"] == ["not saved", "not saved"]
    assert all(isinstance(s, dict) for s in site_series(unsaved, SITE)["stats"])


def test_a_generation_that_raised_shows_the_steps_it_ran() -> None:
    model, prompt = tiny_gpt2(seed=5)

    def two_then_raise(model, ids):
        for _ in range(2):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=-1)
        raise RuntimeError("the decode loop stopped")

    with pytest.raises(RuntimeError, match="the decode loop stopped") as raised:
        torchlog.log_generation(model, prompt, decode=two_then_raise)
    partial = raised.value.torchlog_generation
    data = _script(generation_html(partial), "torchlog-generation")
    assert partial.is_partial and data["partial"] is True and len(data["steps"]) == 2
    assert [s["chosen"] for s in data["steps"]] == [None, None]  # no sequences: no token chosen is known
    assert data["steps"][1]["read"]["length"] == prompt.shape[-1] + 1  # no KV cache: the whole sequence


def test_bad_input_is_refused_naming_the_value(gen, tmp_path) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="GenerationHistory, got ModelHistory"):
        generation_html(gen.steps[0])
    with pytest.raises(TorchlogError, match="holds no steps"):
        generation_html(GenerationHistory("Empty", torch.tensor([[1]]), []))
    with pytest.raises(StepNotFoundError, match=r"step 9 is out of range.*valid: -5\.\.4"):
        generation_html(gen, step=9)
    with pytest.raises(LayerNotFoundError, match="'transformer.h.7' is at no step"):
        generation_html(gen, site="transformer.h.7")
    with pytest.raises(InvalidArgumentTypeError, match="token_text must be a function"):
        generation_html(gen, token_text="decode")
    with pytest.raises(InvalidOptionError, match="colour_by.*generation_html"):
        to_html(gen, tmp_path / "g.html", colour_by={"x": 1.0})
    with pytest.raises(InvalidOptionError, match="mode must be"):
        generation_html(gen, mode="flat")


def test_a_generation_too_large_for_one_page_is_sent_to_the_server(gen, monkeypatch) -> None:
    one_step = len(generation.step_data_json(gen, 0, None, None))
    monkeypatch.setattr(generation, "EMBED_LIMIT_BYTES", 2 * one_step)
    with pytest.raises(InvalidOptionError, match=r"steps 0-2 .*serve_generation\(gen\)"):
        generation_html(gen)
    assert "torchlog-step-0" not in generation_html(gen, served=True)  # served: no step data at all


def test_to_html_and_show_open_a_generation(gen, tmp_path) -> None:
    written = Path(to_html(gen, tmp_path / "gen.html"))
    assert 'id="torchlog-step-frame"' in written.read_text() and written.read_text().isascii()
    inline = show(gen, height=500)
    assert 'id="torchlog-step-frame"' in inline and inline.height == 500
    # The history's own methods are these calls.
    assert Path(gen.to_html(str(tmp_path / "own.html"))).read_text() == written.read_text()
    assert gen.show(height=500) == inline


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_server_builds_steps_and_sites_when_asked(gen) -> None:
    server = serve_generation(gen)
    try:
        status, page = _get(server.url + "step/2")
        step = _script(page.decode(), "torchlog-data")
        assert status == 200 and [p["shape"] for p in step["passes"]] == [list(r.shape) for r in gen.steps[2]]
        status, body = _get(server.url + "site?key=" + SITE)
        assert status == 200 and json.loads(body) == json.loads(json.dumps(site_series(gen, SITE)))
        status, body = _get(server.url + "step/7")
        assert status == 404 and "step 7 is out of range" in json.loads(body)["error"]
        status, body = _get(server.url + "site?key=nowhere_1_1")
        assert status == 404 and "'nowhere_1_1' is at no step" in json.loads(body)["error"]
    finally:
        server.shutdown()
        server.server_close()


# ----- in a browser ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def driver():
    browser = start_browser()
    yield browser
    browser.quit()


def _open(driver, url: str, step: int) -> None:
    driver.get(url)
    assert wait_for(driver, "return document.body.dataset.ready") == "true"
    wait_for(driver, f"return document.body.dataset.stepReady === '{step}'")


def _shown(driver) -> dict[str, Any]:
    """The step shown: its tokens line, the frame page's passes and whether it drew, the hash."""
    return driver.execute_script(
        "const frame = document.getElementById('torchlog-step-frame').contentWindow;"
        "const part = (n) => document.querySelector(`#torchlog-step-tokens [data-part=${n}]`)?.textContent;"
        "return {read: part('read'), chosen: part('chose'), hash: decodeURIComponent(location.hash),"
        " select: document.getElementById('torchlog-step').value,"
        " passes: frame.torchlogViewer.data.passes.map(p => [p.label, p.shape]),"
        " drawn: frame.document.body.dataset.ready,"
        " nodes: frame.document.querySelectorAll('#torchlog-graph g.node').length};")


def _check_step(driver, gen, k: int) -> None:
    shown = _shown(driver)
    ids = " ".join(str(i) for i in gen.input_ids(k).reshape(-1).tolist())
    assert shown["read"] == f'{ids} "{_letters(gen.input_ids(k).reshape(-1).tolist())}"'
    assert shown["chosen"] == f'{gen.token(k).item()} "{_letters([gen.token(k).item()])}"'
    assert shown["passes"] == [[r.label, list(r.shape)] for r in gen.steps[k]]
    assert shown["drawn"] == "true" and shown["nodes"] > 5 and shown["select"] == str(k)
    assert f"step={k}" in shown["hash"]


def _chart_points(driver) -> list[dict[str, float]]:
    """The figures of each point of the chart over the steps, read off its tooltips."""
    titles = driver.execute_script(
        "return [...document.querySelectorAll('#torchlog-panel svg.passes rect.hit title')].map(t => t.textContent)")
    points = []
    for k, title in enumerate(titles):
        match = re.fullmatch(rf"step {k}: mean (\S+), std (\S+), min (\S+), max (\S+)", title)
        assert match, title
        points.append(dict(zip(("mean", "std", "min", "max"), map(float, match.groups()))))
    return points


def _assert_oracle(points, gen, site) -> None:
    expected = _oracle(gen, site)
    assert len(points) == len(expected) == NUM_STEPS
    for got, want in zip(points, expected):
        for key in want:  # the page shows five significant digits
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=1e-6), key


@pytest.mark.browser
def test_the_step_control_switches_the_graph_and_the_tokens(driver, gen, tmp_path) -> None:
    page = tmp_path / "gen.html"
    page.write_text(generation_html(gen, token_text=_letters))
    _open(driver, page.as_uri() + f"#site={SITE}", 0)
    first = driver.execute_script("return document.getElementById('torchlog-step').options[0].textContent")
    assert first == "0 (prefill)"
    _check_step(driver, gen, 0)
    assert _shown(driver)["passes"] != [[r.label, list(r.shape)] for r in gen.steps[1]]  # steps differ: the check bites
    driver.find_element("id", "torchlog-step-next").click()
    wait_for(driver, "return document.body.dataset.stepReady === '1'")
    _check_step(driver, gen, 1)
    driver.execute_script("const s = document.getElementById('torchlog-step'); s.value = '4';"
                          "s.dispatchEvent(new Event('change'));")
    wait_for(driver, "return document.body.dataset.stepReady === '4'")
    _check_step(driver, gen, 4)
    assert driver.find_element("id", "torchlog-step-next").get_attribute("disabled") == "true"
    driver.find_element("id", "torchlog-step-prev").click()
    wait_for(driver, "return document.body.dataset.stepReady === '3'")
    _check_step(driver, gen, 3)
    # The site's statistics over the steps equal torch's on each step's saved value.
    _assert_oracle(_chart_points(driver), gen, SITE)
    # Reopened from its link, the page shows that step.
    _open(driver, page.as_uri() + f"#step=2&site={SITE}", 2)
    _check_step(driver, gen, 2)


@pytest.mark.browser
def test_a_click_on_a_node_plots_it_over_the_steps(driver, gen, tmp_path) -> None:
    page = tmp_path / "gen.html"
    page.write_text(generation_html(gen, step=1))
    _open(driver, page.as_uri(), 1)
    assert "Type a site" in driver.find_element("id", "torchlog-panel").text
    frame = driver.find_element("id", "torchlog-step-frame")
    driver.switch_to.frame(frame)
    everywhere = {r.label for r in gen.steps[1] if r.dtype.is_floating_point and r.func_name in ("add", "linear")
                  and all(r.label in step and step[r.label].saved is not None for step in gen.steps)}
    node = next(e for e in driver.find_elements("css selector", "#torchlog-graph g.node[data-label]")
                if e.is_displayed() and e.get_attribute("data-label") in everywhere)
    label = node.get_attribute("data-label")
    node.click()
    driver.switch_to.default_content()
    wait_for(driver, f"return document.body.dataset.site === {label!r}")
    _assert_oracle(_chart_points(driver), gen, label)
    assert driver.execute_script("return decodeURIComponent(location.hash)") == f"#step=1&site={label}"


@pytest.mark.browser
def test_a_link_to_a_step_out_of_range_says_so(driver, gen, tmp_path) -> None:
    page = tmp_path / "gen.html"
    page.write_text(generation_html(gen))
    _open(driver, page.as_uri() + "#step=9&site=nowhere", 0)
    status = driver.find_element("id", "torchlog-steps-status").text
    assert "step=9 is not a step of this generation" in status and "0-4; 0 is the prefill" in status
    assert 'Site "nowhere" is at no step' in driver.find_element("id", "torchlog-site-error").text
    assert _shown(driver)["select"] == "0"


@pytest.mark.browser
def test_a_served_generation_builds_the_step_it_opens(driver, gen) -> None:
    server = serve_generation(gen, token_text=_letters)
    try:
        _open(driver, server.url + f"#step=2&site={SITE}", 2)
        _check_step(driver, gen, 2)
        _assert_oracle(_chart_points(driver), gen, SITE)
        driver.find_element("id", "torchlog-step-next").click()
        wait_for(driver, "return document.body.dataset.stepReady === '3'")
        _check_step(driver, gen, 3)
    finally:
        server.shutdown()
        server.server_close()
