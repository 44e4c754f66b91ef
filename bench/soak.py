"""A soak of mixed traffic on the real default model through `tritonllm serve`: does the server stay correct and
its memory flat when it runs for a long while?

    make soak                                   # an hour; writes bench/results/soak.{md,json}
    .venv/bin/python bench/soak.py --minutes 2  # a short try (writes soak-2min.{md,json})
    .venv/bin/python bench/soak.py --minutes 20 --tree /tmp/old   # another checkout's code, on this venv

Eight clients on loopback send requests back to back, each of a kind drawn at random: streamed chat, streamed chat
dropped after a few chunks, completions with n = 2, embeddings, generate_stream, chat with a forced tool call, and
bad requests (each with the 4xx it must get). Checks, each a line of the report; the exit status is 1 when one
fails:
  - no response with a 5xx status, and every valid request succeeds (a dropped stream counts as succeeded once it
    streamed);
  - every bad request gets its own 4xx;
  - every process flat: its RSS, sampled every 10 s, grows by at most 0.5 MB a minute over the second half of the
    run (the least-squares slope; the first half is the warm-up, in which allocators and caches reach their
    size). A leak of a few MB a minute passes a bound on the end against the start for half an hour, and grows a
    server by gigabytes in a week; a slope shows it within minutes;
  - the summed RSS of the server's processes at the end within 10% of what it was after the warm-up (the first
    fifth of the run, at most 5 minutes). Before the traffic the whole KV pool is touched (kv_pool.py), so that
    the pool filling in is not taken for growth;
  - KV blocks in use back to 0 within 30 s of the last request, and the server healthy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import kv_pool
import numpy as np
from peers import MODEL, Server, free_port, ours
from run import RESULTS, machine
from serving_cost import rss_by_role

CLIENTS = 8
MAX_RSS_GROWTH = 0.10
MAX_SLOPE_MB_PER_MINUTE = 0.5
DEFAULT_MINUTES = 60
MB = 2**20
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOPICS = ["the sea", "a small town", "bread", "trains", "the moon", "a library", "rain", "chess", "winter", "bees"]
EMBEDDING_MODEL = "all-MiniLM-L6-v2"


@dataclass
class Outcome:
    kind: str
    ok: bool
    status: int  # HTTP status; 0 when no response came
    seconds: float
    detail: str = ""


@dataclass
class Soak:
    minutes: float
    outcomes: list[Outcome] = field(default_factory=list)
    rss_mb: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (seconds since start, by process)
    kv_blocks_used_idle: float | None = None
    healthy_after: bool = False


def _prompt(rng: random.Random) -> str:
    return f"Write two sentences about {rng.choice(TOPICS)} and {rng.choice(TOPICS)}."


async def chat_stream(client, rng: random.Random, drop: bool) -> str:
    stream = await client.chat.completions.create(
        model=MODEL.name,
        messages=[{"role": "user", "content": _prompt(rng)}],
        max_tokens=rng.randint(16, 96),
        temperature=rng.choice([0, 0.7]),
        stream=True,
    )
    chunks, finish = 0, None
    async with stream:
        async for chunk in stream:
            chunks += 1
            finish = chunk.choices[0].finish_reason if chunk.choices else finish
            if drop and chunks == 3:
                return ""  # leaving mid-stream: the server must end the generation and free its blocks
    return "" if finish else "the stream ended without a finish reason"


async def completion_n(client, rng: random.Random) -> str:
    answer = await client.completions.create(
        model=MODEL.name, prompt=_prompt(rng), n=2, max_tokens=rng.randint(8, 48), temperature=0.8
    )
    return "" if len(answer.choices) == 2 and all(c.finish_reason for c in answer.choices) else "not 2 choices"


async def embeddings(client, rng: random.Random) -> str:
    texts = [_prompt(rng) for _ in range(rng.randint(1, 4))]
    answer = await client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
    return "" if len(answer.data) == len(texts) and len(answer.data[0].embedding) == 384 else "wrong embeddings"


async def generate_stream(http: httpx.AsyncClient, rng: random.Random) -> str:
    body = {"text_input": _prompt(rng), "parameters": {"max_new_tokens": rng.randint(8, 64), "details": True}}
    events = []
    async with http.stream("POST", f"/v2/models/{MODEL.name}/generate_stream", json=body) as response:
        if response.status_code != 200:
            raise httpx.HTTPStatusError("generate_stream", request=response.request, response=response)
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    return "" if events and "finish_reason" in events[-1]["details"] else "no final event"


async def tool_call(client, rng: random.Random) -> str:
    answer = await client.chat.completions.create(
        model=MODEL.name,
        messages=[{"role": "user", "content": f"What is the weather in {rng.choice(['Paris', 'Oslo', 'Lima'])}?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    calls = answer.choices[0].message.tool_calls or []
    return "" if calls and calls[0].function.name == "get_weather" else "no tool call"


# Each bad request and the status it must get.
BAD_REQUESTS = [
    ("/v1/chat/completions", {"model": MODEL.name, "messages": [{"role": "user", "content": "x"}], "top_p": 2}, 400),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404),
    ("/v1/chat/completions", {"model": MODEL.name, "messages": []}, 400),
    ("/v1/completions", {"model": MODEL.name, "prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": MODEL.name, "prompt": "x", "max_tokens": 10**7}, 400),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": []}, 400),
]


async def bad_request(http: httpx.AsyncClient, rng: random.Random) -> tuple[int, str]:
    path, body, expected = rng.choice(BAD_REQUESTS)
    response = await http.post(path, json=body)
    return response.status_code, "" if response.status_code == expected else f"{path} {body}: wanted {expected}"


KINDS = ["chat_stream", "chat_dropped", "completion_n", "embeddings", "generate_stream", "tool_call", "bad_request"]


async def one(kind: str, client, http: httpx.AsyncClient, rng: random.Random) -> Outcome:
    from openai import APIConnectionError, APIStatusError

    started = time.monotonic()
    status, detail = 200, ""
    try:
        if kind == "bad_request":
            status, detail = await bad_request(http, rng)
        elif kind in ("chat_stream", "chat_dropped"):
            detail = await chat_stream(client, rng, drop=kind == "chat_dropped")
        elif kind == "completion_n":
            detail = await completion_n(client, rng)
        elif kind == "embeddings":
            detail = await embeddings(client, rng)
        elif kind == "generate_stream":
            detail = await generate_stream(http, rng)
        else:
            detail = await tool_call(client, rng)
    except APIStatusError as e:
        status, detail = e.status_code, str(e)[:300]
    except httpx.HTTPStatusError as e:
        status, detail = e.response.status_code, e.response.text[:300]
    except (APIConnectionError, httpx.HTTPError) as e:
        status, detail = 0, f"{type(e).__name__}: {e}"[:300]
    ok = not detail and (status == 200 or kind == "bad_request")
    return Outcome(kind, ok, status, time.monotonic() - started, detail)


async def traffic(base_url: str, seconds: float, soak: Soak) -> None:
    from openai import AsyncOpenAI

    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=2 * CLIENTS)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as http:
        client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)

        async def worker(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                soak.outcomes.append(await one(rng.choice(KINDS), client, http, rng))

        await asyncio.gather(*(worker(seed) for seed in range(CLIENTS)))
        await client.close()


async def sample_rss(server: Server, soak: Soak, started: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        soak.rss_mb.append((time.monotonic() - started, rss_by_role(server)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10)


def kv_blocks_used(metrics_port: int) -> float:
    return kv_pool.metric_sum(metrics_port, "tritonllm_kv_blocks_used")


def run(minutes: float, tree: Path | None) -> Soak:
    soak = Soak(minutes)
    metrics_port = free_port()
    server, shim_port, _ = ours(RESULTS / "tritonllm-soak.log.tmp", tree=tree, metrics_port=metrics_port)
    try:

        async def main() -> None:
            await kv_pool.fill(f"http://127.0.0.1:{shim_port}", MODEL.name, kv_pool.pool_tokens(metrics_port))
            stop, started = asyncio.Event(), time.monotonic()
            sampler = asyncio.create_task(sample_rss(server, soak, started, stop))
            await traffic(f"http://127.0.0.1:{shim_port}", minutes * 60, soak)
            stop.set()
            await sampler

        asyncio.run(main())
        soak.rss_mb.append((soak.rss_mb[-1][0] + 10, rss_by_role(server)))
        deadline = time.monotonic() + 30
        while (used := kv_blocks_used(metrics_port)) and time.monotonic() < deadline:
            time.sleep(1)
        soak.kv_blocks_used_idle = used
        soak.healthy_after = httpx.get(f"http://127.0.0.1:{shim_port}/health", timeout=10).status_code == 200
    finally:
        server.stop()
    return soak


def summed(soak: Soak) -> list[tuple[float, float]]:
    return [(t, sum(by_process.values())) for t, by_process in soak.rss_mb]


def rss_growth(soak: Soak) -> tuple[float, float, float]:
    """Summed RSS after the warm-up (the first fifth, at most 5 minutes), at the end, and the growth between them."""
    warm_up = min(soak.minutes * 60 / 5, 300)
    totals = summed(soak)
    after_warm_up = next(rss for t, rss in totals if t >= warm_up)
    end = totals[-1][1]
    return after_warm_up, end, end / after_warm_up - 1


def slopes(soak: Soak) -> dict[str, float]:
    """Each process's RSS slope in MB a minute over the second half of the run, by least squares."""
    half = [(t, by_process) for t, by_process in soak.rss_mb if t >= soak.rss_mb[-1][0] / 2]
    minutes = np.array([t / 60 for t, _ in half])
    names = dict.fromkeys(name for _, by_process in half for name in by_process)
    return {
        name: float(np.polyfit(minutes, [by_process.get(name, 0.0) for _, by_process in half], 1)[0]) for name in names
    }


def checks(soak: Soak) -> list[tuple[str, bool]]:
    valid = [o for o in soak.outcomes if o.kind != "bad_request"]
    bad = [o for o in soak.outcomes if o.kind == "bad_request"]
    warm, end, growth = rss_growth(soak)
    server_faults = sum(o.status >= 500 or o.status == 0 for o in soak.outcomes)
    by_process = slopes(soak)
    growing = {name: slope for name, slope in by_process.items() if slope > MAX_SLOPE_MB_PER_MINUTE}
    steepest = max(by_process.items(), key=lambda kv: kv[1])
    return [
        (f"responses with a 5xx or no response: {server_faults}", server_faults == 0),
        (f"valid requests that failed: {sum(not o.ok for o in valid)} of {len(valid)}", all(o.ok for o in valid)),
        (f"bad requests without their 4xx: {sum(not o.ok for o in bad)} of {len(bad)}", all(o.ok for o in bad)),
        (
            f"RSS slope over the second half, steepest {steepest[0]} {steepest[1]:+.2f} MB/min (at most "
            f"{MAX_SLOPE_MB_PER_MINUTE} MB/min each)"
            + (f"; growing: {', '.join(f'{n} {v:+.2f}' for n, v in growing.items())}" if growing else ""),
            not growing,
        ),
        (
            f"RSS after warm-up {warm:.0f} MB, at the end {end:.0f} MB: {growth:+.1%} (at most {MAX_RSS_GROWTH:+.0%})",
            growth <= MAX_RSS_GROWTH,
        ),
        (f"KV blocks in use once idle: {soak.kv_blocks_used_idle:.0f}", soak.kv_blocks_used_idle == 0),
        ("healthy after the run", soak.healthy_after),
    ]


def write_report(soak: Soak, name: str) -> bool:
    results = checks(soak)
    passed = all(ok for _, ok in results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # every request's outcome stays out (a 30-minute run has some 12,000): counts by kind and status, and failures
    summary = {k: v for k, v in asdict(soak).items() if k != "outcomes"}
    summary["requests"] = {
        kind: dict(Counter(str(o.status) for o in soak.outcomes if o.kind == kind)) for kind in KINDS
    }
    summary["failures"] = [asdict(o) for o in soak.outcomes if not o.ok]
    summary["checks"] = [{"check": text, "ok": ok} for text, ok in results]
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), **summary}, indent=1))
    by_kind: dict[str, list[Outcome]] = defaultdict(list)
    for o in soak.outcomes:
        by_kind[o.kind].append(o)
    lines = [
        f"# Soak: {soak.minutes:g} minutes of mixed traffic, SmolLM2-135M-Instruct (fp32), {CLIENTS} clients",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`. Machine: `{json.dumps(machine())}`.",
        "",
        f"**{'PASSED' if passed else 'FAILED'}**",
        "",
        *[f"- {'ok' if ok else 'FAILED'}: {text}" for text, ok in results],
        "",
        "| kind | requests | succeeded | statuses | median s | p95 s |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        outcomes = by_kind.get(kind, [])
        if not outcomes:
            continue
        seconds = sorted(o.seconds for o in outcomes)
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(Counter(o.status for o in outcomes).items()))
        lines.append(
            f"| {kind} | {len(outcomes)} | {sum(o.ok for o in outcomes)} | {statuses} | "
            f"{statistics.median(seconds):.2f} | {seconds[int(0.95 * (len(seconds) - 1))]:.2f} |"
        )
    at_half = next(by_process for t, by_process in soak.rss_mb if t >= soak.rss_mb[-1][0] / 2)
    lines += [
        "",
        "| process | RSS at the half, MB | at the end, MB | slope over the second half, MB/min |",
        "|---|---|---|---|",
    ]
    for process, slope in slopes(soak).items():
        at_end = soak.rss_mb[-1][1].get(process, 0)
        lines.append(f"| {process} | {at_half.get(process, 0):.1f} | {at_end:.1f} | {slope:+.3f} |")
    lines += ["", "Summed RSS of the server's processes (MB), each minute:", ""]
    totals = summed(soak)
    minute_marks = [rss for t, rss in totals if int(t) % 60 < 10] or [rss for _, rss in totals]
    lines.append(", ".join(f"{rss:.0f}" for rss in minute_marks))
    failures = [o for o in soak.outcomes if not o.ok][:10]
    if failures:
        lines += ["", "First failures:", ""] + [f"- {o.kind} {o.status}: {o.detail}" for o in failures]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES)
    parser.add_argument("--tree", type=Path, help="the code and model repository of another checkout")
    args = parser.parse_args()
    soak = run(args.minutes, args.tree)
    name = "soak" if args.minutes == DEFAULT_MINUTES and args.tree is None else f"soak-{args.minutes:g}min"
    name += "-tree" if args.tree is not None else ""
    sys.exit(0 if write_report(soak, name) else 1)


if __name__ == "__main__":
    main()
