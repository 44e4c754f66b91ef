"""The chat page at the shim's `/`, in a real headless browser (Debian's chromium through its chromedriver): a
message sent and its answer streamed (equal to the same chat asked whole), Stop pressed mid-answer and the
generation's KV blocks freed, the markdown rendered and escaped, the API key asked for and honoured."""

from __future__ import annotations

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait
from triton_helpers import metric, wait_for

from tritonllm.shim.settings import ServedModel, ShimSettings
from tritonllm.wire.triton_names import TritonNames

from .conftest import MODEL, running_shim

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's (Makefile: system-deps)


@pytest.fixture(scope="module")
def browser():
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def fill(browser, field: str, value: str) -> None:
    element = browser.find_element(By.ID, field)
    element.clear()
    element.send_keys(value)


def open_page(browser, url: str, **settings: str) -> None:
    browser.get(url)
    WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#model option"))
    for field, value in settings.items():
        fill(browser, field, value)


def send(browser, text: str) -> None:
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys(text)
    prompt.send_keys(Keys.ENTER)


def answer_meta(browser) -> str:
    metas = browser.find_elements(By.CSS_SELECTOR, ".message.assistant .meta")
    return metas[-1].text if metas else ""


def test_a_message_streams_an_answer_equal_to_the_whole_one(browser, shim_url, openai_client):
    open_page(browser, shim_url, temperature="0", max_tokens="12", extra='{"min_tokens": 12}')
    send(browser, "Hello")
    WebDriverWait(browser, 60).until(lambda b: answer_meta(b))
    assert "12 tokens" in answer_meta(browser) and "tokens/s" in answer_meta(browser)
    streamed = browser.execute_script("return state.history.at(-1).content")
    whole = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], temperature=0, max_tokens=12,
        extra_body={"min_tokens": 12},
    )  # fmt: skip
    assert streamed == whole.choices[0].message.content
    assert browser.find_element(By.CSS_SELECTOR, ".message.assistant .body").text.strip()  # shown, rendered


def test_stop_mid_answer_ends_the_generation_and_frees_its_blocks(browser, shim_url, triton):
    cancelled = metric(triton, "tritonllm_requests_finished_total", 'reason="cancelled"')
    open_page(browser, shim_url, max_tokens="1900", extra='{"min_tokens": 1900}')
    send(browser, "Tell me a long story")
    answers = lambda b: b.find_elements(By.CSS_SELECTOR, ".message.assistant .body")  # noqa: E731
    WebDriverWait(browser, 60).until(lambda b: answers(b) and answers(b)[-1].text.strip())  # mid-answer
    assert metric(triton, "tritonllm_kv_blocks_used") > 0
    browser.find_element(By.ID, "stop").click()
    WebDriverWait(browser, 30).until(lambda b: answer_meta(b).startswith("stopped"))
    assert browser.find_element(By.ID, "send").is_displayed()
    assert wait_for(lambda: metric(triton, "tritonllm_requests_finished_total", 'reason="cancelled"') == cancelled + 1)
    assert wait_for(lambda: metric(triton, "tritonllm_kv_blocks_used") == 0)
    assert metric(triton, "tritonllm_requests_running") == 0


def test_answers_render_markdown_and_code_with_the_models_markup_escaped(browser, shim_url):
    browser.get(shim_url)
    source = "# Title\n**bold** and `x<y`\n\n- one\n- two\n\n```python\nprint('<b>hi</b>')\n```\n"
    source += "<script>alert(1)</script>"
    html = browser.execute_script("return renderMarkdown(arguments[0])", source)
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<code>x&lt;y</code>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert "<pre><code class=\"language-python\">print('&lt;b&gt;hi&lt;/b&gt;')</code></pre>" in html
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_page_asks_for_the_api_key_and_its_calls_carry_it(browser, triton):
    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, api_key="page-key")
    with running_shim(settings) as url:
        browser.get(url)  # the page itself needs no key
        browser.execute_script("localStorage.clear()")
        browser.refresh()
        status = browser.find_element(By.ID, "status")
        WebDriverWait(browser, 20).until(lambda b: "API key" in status.text)
        fill(browser, "api_key", "page-key")
        browser.find_element(By.ID, "system").click()  # the key field's change event
        WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#model option"))
        fill(browser, "max_tokens", "3")
        send(browser, "Hi")
        WebDriverWait(browser, 60).until(lambda b: answer_meta(b))
        assert "tokens" in answer_meta(browser)
        browser.execute_script("localStorage.clear()")


def test_a_thinking_models_reasoning_shows_in_a_block_apart_from_its_answer(browser, shim_url):
    browser.get(shim_url)
    html = browser.execute_script(
        """const box = addMessage("assistant");
        draw({answer: "**42**", reasoning: "<weighing it>", box});
        return box.querySelector(".body").innerHTML;"""
    )
    reasoning = '<details class="reasoning" open=""><summary>Reasoning</summary>&lt;weighing it&gt;</details>'
    assert html.startswith(reasoning)
    assert html.endswith("<p><strong>42</strong></p>")


def test_several_models_get_a_picker_and_an_image_model_the_attach_button(browser, triton):
    """A second LLM (here the same Triton models under a second name, said to take images) is picked by name;
    the image control shows only for the model whose card takes images."""
    beside = ServedModel("tiny-vision", TritonNames(), media=("image",))
    settings = ShimSettings(triton_grpc_url=triton.grpc_url, served_model_name=MODEL, more_models=(beside,))
    with running_shim(settings) as url:
        open_page(browser, url, max_tokens="3")
        picker = Select(browser.find_element(By.ID, "model"))
        assert [option.text for option in picker.options] == [MODEL, "tiny-vision"]
        assert picker.first_selected_option.text == MODEL and not browser.find_element(By.ID, "attach").is_displayed()
        picker.select_by_visible_text("tiny-vision")
        assert browser.find_element(By.ID, "attach").is_displayed()
        send(browser, "Hi")
        WebDriverWait(browser, 60).until(lambda b: answer_meta(b))
        assert "tokens" in answer_meta(browser)  # the shim took the picked name
