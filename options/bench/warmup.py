"""Before a measured run: the unmeasured warm-up requests, then the prompt calibration (how
many of the target's tokens a prompt word makes), shared by every profile of the bench.
"""
from __future__ import annotations

from options.core import BadInput


def warm_up_and_calibrate(args, send, template, console, seed: int, texts: bool = False):
    """``--warmup`` unmeasured requests, then the prompt calibration (unless --no-calibrate or
    the prompts are given as ``texts``). (False, None) when the target is unusable."""
    from dataclasses import replace

    from options.bench import runner
    from options.contract import collect

    for i in range(args.warmup):
        try:
            collect(send(replace(template, prompt=f"warm-up {i}", max_tokens=8)))
        except BadInput:
            raise
        except Exception as exc:  # the target is unusable: say why, measure nothing
            console.print(f"[red]the target did not answer the warm-up request:[/red] {exc}")
            return False, None
    if args.no_calibrate or texts:
        return True, None
    try:
        tokens = runner.calibrate(send, template, seed)
    except Exception as exc:
        console.print(f"[red]calibrating prompt lengths failed:[/red] {exc}")
        return False, None
    if tokens is None:
        console.print("the target reports no prompt token counts: prompts are sized at one "
                      "word per token (counts.input_tokens stays 0)")
    return True, tokens
