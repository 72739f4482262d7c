"""``python -m options.bench``'s default profile (``--profile requests``): independent
requests, sent as the traffic profile says (``profile``, ``runner``), summarised
(``metrics``) and written as the ``spectrum.bench/1`` JSON (``report``).
"""
from __future__ import annotations


def bench_requests(args, profile, template, send, details, console) -> int:
    """``python -m options.bench`` (``--profile requests``): warm up, send, summarise, write JSON, print the table."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from options.bench import report, runner
    from options.bench.metrics import summarize
    from options.bench.warmup import warm_up_and_calibrate

    ready, tokens = warm_up_and_calibrate(args, send, template, console, profile.seed,
                                          texts=bool(profile.prompt_tokens.texts))
    if not ready:
        return 1
    errors = 0
    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(),
                  console=console, disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("requests", total=profile.requests, errors=0)

        def on_done(n, rec):
            nonlocal errors
            errors += 0 if rec.ok else 1
            bar.update(task, completed=n, errors=errors)

        result = runner.run(profile, send, template, on_done, tokens)
    summary = summarize(result.records, result.duration_s)
    details = {**details, "ignore_eos": args.ignore_eos, "warmup_requests": args.warmup,
               "prompt_calibration": tokens.to_json() if tokens else None}
    doc = report.bench_json(summary, profile, level=args.level, target=args.target,
                            model=template.model or args.model or details.get("served_model"),
                            started_at=result.started_at, details=details)
    if args.json:
        report.write_json(doc, args.json)
    if args.json != "-":
        console.print(report.render_table(doc))
    if summary.completed == 0:
        console.print(f"[red]every request failed:[/red] {summary.errors}")
        return 1
    return 0
