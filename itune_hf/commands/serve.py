"""`itune serve`: the browser demo (caption, per-word heatmaps, adapter switch) on a local port (`itune_hf.app`)."""

from __future__ import annotations

import argparse

HELP = "Serve a web page to caption photos and see per-word attention heatmaps (needs the [app] extra: gradio)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="Directory or Hub id of a full or adapter-only checkpoint, or a preset name (its random weights: for "
        "trying the page; the other commands refuse a preset). Default: the first --adapter.",
    )
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="An adapter-only checkpoint of the same base to offer in the page, under NAME (DIR alone: named after "
        "its folder); repeatable: all share one base, and each request chooses one.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default 127.0.0.1; 0.0.0.0: all).")
    parser.add_argument("--port", type=int, default=7860, help="TCP port (default 7860).")
    parser.add_argument("--max-beams", type=int, default=5, help="Largest beam size the page offers (default 5).")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="Longest caption the page offers (default 40).")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from . import CommandError

    if importlib.util.find_spec("gradio") is None:
        raise CommandError("itune serve needs gradio: pip install 'itune-hf[app]'")
    if not 0 < args.port < 65536:
        raise CommandError(f"--port must be between 1 and 65535, got {args.port}")
    for name in ("max_beams", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    _check_port_free(args.host, args.port)
    import sys

    from ..app import Limits, load_service, serve
    from ..evaluation import check_caption_length
    from ..models import family_of
    from ._models import check_model_argument

    model, model_name, adapters = _model_and_adapters(args)
    if check_model_argument(model, preset_serves=True):
        print(f"itune serve: --model {model} is a preset (an untrained setup): its weights are random and the "
              "captions noise; serve a trained checkpoint for real captions", file=sys.stderr)  # fmt: skip
    limits = Limits(max_beams=args.max_beams, max_new_tokens=args.max_new_tokens)
    service = load_service(model, adapters, limits=limits, model_name=model_name)
    check_caption_length(service.model, args.max_new_tokens)  # the page offers up to it: every length must fit
    family = family_of(service.model)
    serving = f"{len(service.adapters)} adapter(s) on one base" if family.saves == "adapter" else family.title
    print(f"itune serve: {serving}; open http://{args.host}:{args.port}")
    serve(service, host=args.host, port=args.port)
    return 0


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port another server listens on before the model loads (gradio would otherwise look for a free port
    after a long load, or fail with a traceback), naming that server's address and what to pass instead."""
    import errno
    import socket

    from . import CommandError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise CommandError(f"--host {host}: not an address this machine can listen on ({error.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise CommandError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
            raise CommandError(
                f"--port {port}: another server already listens at http://{host}:{port} (perhaps an earlier itune "
                "serve; open that page, stop it, or pass another --port)"
            ) from None


def _model_and_adapters(args: argparse.Namespace) -> tuple[str, str | None, dict[str, str]]:
    """`(model, its name in the page, {name: adapter directory})`: `--model` and the `--adapter`s, or without
    `--model` the first adapter as the model (under its name) and the others beside it."""
    from ..adapter.switching import parse_named_adapters
    from . import CommandError

    try:
        adapters = parse_named_adapters(args.adapter)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if args.model:
        return args.model, None, adapters
    if not adapters:
        raise CommandError("--model is required (or --adapter NAME=DIR, repeatable)")
    name, path = next(iter(adapters.items()))
    return path, name, {other: p for other, p in adapters.items() if other != name}
