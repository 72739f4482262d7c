"""Which rung: the classic decision tree, weighed against what each rung would cost.

The tree climbs only as far as a requirement forces it (each rung up is more to build and run):
only need the output -> 1; must run in your account -> 2; the model or its config is not a
JumpStart one-click -> 3; the serving code must change -> 4; a custom image -> 5; you must own
the infrastructure -> 6. Cost can then move the answer up, but only when the saving is worth it.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from cost.breakeven import tokens
from cost.fleet import DAYS_PER_MONTH, Fleet, Traffic, bedrock_cost, compare
from cost.prices import TokenPrice
from options.core import BadInput
from options.core import RUNGS

# (flag dest, lowest rung that satisfies it, why, in plain words)
REQUIREMENTS: tuple[tuple[str, int, str], ...] = (
    ("own_account", 2, "the model must run in your own AWS account"),
    ("not_on_bedrock", 2, "the model is not offered on Bedrock"),
    ("custom_model", 3, "your model or its serving configuration is not a JumpStart one-click deploy"),
    ("custom_serving_code", 4, "the serving code (pre/post-processing, loading, batching) must change"),
    ("custom_image", 5, "you need your own serving image (CUDA, Python, engine, server)"),
    ("own_infrastructure", 6, "you must own the infrastructure (cluster, nodes, autoscaling)"),
)


@dataclass
class Requirements:
    flags: dict[str, bool]

    @property
    def floor(self) -> int:
        return max([1] + [level for dest, level, _ in REQUIREMENTS if self.flags.get(dest)])

    def reasons(self) -> list[str]:
        return [f"{why} -> rung {level} or above" for dest, level, why in REQUIREMENTS if self.flags.get(dest)]

    def without(self, dest: str) -> "Requirements":
        return Requirements({k: v for k, v in self.flags.items() if k != dest})


def recommend(req: Requirements, price: TokenPrice | None = None, traffic: Traffic | None = None,
              fleets: list[Fleet] | None = None, min_savings_pct: float = 30.0,
              tier: str = "on_demand") -> dict[str, Any]:
    floor = req.floor
    why = req.reasons() or ["no requirement given forces you past Bedrock: the decision tree stops at rung 1"]
    flip: list[str] = []
    costs = None
    level = floor
    if price is not None and traffic is not None and fleets:
        costs = compare(traffic, price, fleets, tier)
        monthly = {r["level"]: r["monthly_usd"] for r in costs["rungs"]}
        feasible = {lvl: usd for lvl, usd in monthly.items() if lvl >= floor}
        if not feasible:
            raise BadInput(f"rung {floor} or above is needed, but the table prices none of them for this "
                           f"instance: choose another --instance")
        if floor not in feasible:  # e.g. no SageMaker price for the instance: the lowest priced rung above
            level = min(feasible)
            why.append(f"rungs {floor}-{level - 1} have no price for this instance, so the lowest priced rung is {level}")
        level = climb(feasible, level, min_savings_pct, why)
        if min(feasible.values()) == feasible[level]:
            why.append(f"it is also the cheapest allowed rung: ${feasible[level]:,.2f}/month for "
                       f"{traffic.tokens_per_month:,.0f} tokens/month")
        flip += _cost_flips(level, floor, traffic, price, fleets, tier, min_savings_pct)
    elif floor == 1:
        flip.append("give the traffic (--avg or --tokens-per-month) and a capacity (--capacity or --bench) "
                    "to weigh self-hosting against the per-token price")
    flip += requirement_flips(req)
    out = {"level": level, "rung": RUNGS[level - 1].name, "tree_level": floor, "why": why, "flip": flip,
           "min_savings_pct": min_savings_pct}
    if costs is not None:
        out["costs"] = costs
    return out


def climb(feasible: dict[int, float], level: int, min_savings_pct: float, why: list[str]) -> int:
    """From ``level``, climb one cheaper rung at a time (``feasible``: level -> monthly USD), and
    only when the step saves enough to pay for the extra work; each step weighed is said in ``why``."""
    for higher in sorted(feasible):
        if higher <= level or feasible[higher] >= feasible[level]:
            continue
        saving = (feasible[level] - feasible[higher]) / feasible[level]
        if saving * 100 >= min_savings_pct:
            why.append(f"rung {higher} costs ${feasible[higher]:,.2f}/month against ${feasible[level]:,.2f} on "
                       f"rung {level}: a {saving:.0%} saving, at least the {min_savings_pct:g} % that pays for "
                       f"running more yourself")
            level = higher
        else:
            why.append(f"rung {higher} would be {saving:.0%} cheaper (${feasible[higher]:,.2f} vs "
                       f"${feasible[level]:,.2f}/month), below the {min_savings_pct:g} % worth the extra work")
    return level


def requirement_flips(req: Requirements) -> list[str]:
    """For each requirement that sets the tree's floor, where the tree would stop without it."""
    floor = req.floor
    return [f"without --{dest.replace('_', '-')}, the tree would stop at rung {req.without(dest).floor} "
            f"({RUNGS[req.without(dest).floor - 1].name})"
            for dest, _, _ in REQUIREMENTS if req.flags.get(dest) and req.without(dest).floor < floor]


def _cost_flips(level: int, floor: int, traffic: Traffic, price: TokenPrice, fleets: list[Fleet],
                tier: str, min_savings_pct: float) -> list[str]:
    flips = []
    blended = bedrock_cost(traffic, price, tier).per_million_usd
    sagemaker = [f for f in fleets if f.level != 6 and f.level >= floor]
    if floor == 1 and sagemaker:
        fleet = sagemaker[0]
        volume = fleet.breakeven_tokens_per_month(traffic, blended)
        bedrock_monthly = traffic.tokens_per_month * blended / 1e6
        if level == 1:
            if volume is None:
                flips.append(f"at this traffic's peak-to-average ratio ({traffic.peak_to_average:.3g}x) no volume makes "
                             f"rung {fleet.level} cheaper with {fleet.capacity.output_tokens_per_second:,.0f} output "
                             f"tok/s per replica: replicas sized for the peak sit idle too much of the time")
            else:
                flips.append(f"traffic above {tokens(volume)} tokens/month (now {tokens(traffic.tokens_per_month)}) makes rung "
                             f"{fleet.level} cheaper than Bedrock; it is recommended once it saves {min_savings_pct:g} %")
            need = _capacity_to_match(fleet, traffic, bedrock_monthly)
            if need is None:
                floor_cost = fleet.monthly(traffic.scaled_to(traffic.tokens_per_month * 1e-9))
                flips.append(f"no replica speed would do at this volume: the {fleet.min_replicas} always-on "
                             f"replica(s) alone cost ${floor_cost:,.2f}/month against Bedrock's "
                             f"${bedrock_monthly:,.2f}")
            else:
                flips.append(f"a replica sustaining {need:,.0f} output tok/s or more (now "
                             f"{fleet.capacity.output_tokens_per_second:,.0f}) would make rung {fleet.level} "
                             f"cost no more than Bedrock at this traffic")
        elif volume is not None:
            flips.append(f"traffic below {tokens(volume)} tokens/month (now {tokens(traffic.tokens_per_month)}) makes "
                         f"Bedrock cheaper again")
    if level == 2 and floor < 3:
        flips.append("rungs 3-5 bill the same instance-hours: if the model is not a JumpStart one-click deploy, "
                     "rung 3 (your model on LMI) costs the same")
    eks = next((f for f in fleets if f.level == 6), None)
    if eks is not None and level != 6 and floor <= 6:
        chosen = next((f for f in fleets if f.level == level), None)
        if chosen is not None:
            delta = chosen.monthly(traffic) - eks.monthly(traffic)
            if delta > 0:
                flips.append(f"rung 6 (EC2 + EKS) would cost ${delta:,.2f}/month less than rung {level}: worth it "
                             f"only if running the cluster costs you less than that")
    return flips


def _capacity_to_match(fleet: Fleet, traffic: Traffic, budget_monthly: float) -> float | None:
    """Output tok/s per replica at which the fleet's monthly cost fits within ``budget_monthly``."""
    idle = (24 - traffic.hours_per_day) * DAYS_PER_MONTH
    spare = budget_monthly - fleet.fixed_monthly - fleet.hourly * fleet.min_replicas * idle
    replicas = math.floor(spare / (fleet.hourly * traffic.active_hours_per_month))
    if replicas < fleet.min_replicas:
        return None
    total_per_replica = traffic.peak_tokens_per_second / replicas
    return total_per_replica * traffic.mix.output_share


# --- from a trace: the simulated rungs, and the deploy command that applies the answer -----------
#
# ``python -m cost recommend --trace`` runs ``python -m cost simulate`` (every rung's autoscaling,
# batching and bill on the trace) and answers from its rows: the tree's requirements remove the
# rungs below their floor, the SLO removes those that miss it, and the same climb as above weighs
# the rest by their simulated monthly bill. The answer carries the autoscaling setting the
# simulation chose, and the ``python -m options.deploy`` command that sets exactly it. That command
# is built here as text (cost sits below the deploy CLI and imports none of it); the tests parse
# it with options.deploy's own parser.

DEPLOY = ("python", "-m", "options.deploy")
SAGEMAKER_LEVELS = (2, 3, 4, 5)
EKS_LEVEL = 6


def _number(x: float) -> str:
    """A flag value that parses back to the same float (``:g`` would round 1234567 to 1.23457e+06)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _sagemaker_metric_names() -> dict[str, str]:
    """AWS's predefined metric name -> the short name --autoscale-metric takes (one table for the
    simulator and options.deploy, so the two cannot drift apart)."""
    from options.core.autoscaling import SAGEMAKER_METRIC_NAMES
    return {name: metric for (metric, _), name in SAGEMAKER_METRIC_NAMES.items()}


def _slo_text(slo: dict[str, Any]) -> str:
    bounds = [f"{k.replace('_ms', '').upper()} <= {slo[k]:,.0f} ms" for k in ("ttft_ms", "e2e_ms") if slo.get(k)]
    return " and ".join(bounds) if bounds else "being served at all"


def policy_text(level: int, policy: dict[str, Any]) -> str:
    """The autoscaling setting in a sentence."""
    if policy.get("kind") == "bedrock_batch":
        return (f"batch inference: jobs answered within {policy['window_s'] / 3600:g} h, outside the on-demand "
                "quotas (you pay the batch price per token)")
    if policy.get("kind") == "bedrock_provisioned_throughput":
        return (f"Provisioned Throughput: {policy['model_units']} model unit(s), {policy['capacity_tpm']:,.0f} "
                f"tokens/minute, term {policy['term']} (billed every hour it exists)")
    if level == 1:
        return (f"on-demand quota of {policy['tpm']:,.0f} tokens/minute" if policy.get("tpm") else "no quota") \
            + " (Bedrock scales itself; you pay per token)"
    if policy.get("kind") == "sagemaker_target_tracking":
        scales = policy.get("scales", "instances")
        per = "copy" if scales == "copies" else "instance"
        unit = (f"invocations per {per} per minute" if "Invocations" in policy["metric"]
                else "concurrent requests per model copy")
        return (f"target tracking on {policy['metric']}: {policy['target']:g} {unit}, "
                f"{policy['min_instances']}-{policy['max_instances']} {scales}"
                + (" (an inference component, one copy per instance)" if scales == "copies" else ""))
    if policy.get("kind") == "hpa_keda_queue_depth":
        return (f"HPA on {policy['metric']}: {policy['target']:g} waiting requests per replica, "
                f"{policy['min_replicas']}-{policy['max_replicas']} replicas")
    if policy.get("kind") == "ray_serve_ongoing_requests":
        return (f"Ray Serve's autoscaler (--engine rayservice): {policy['target']:g} ongoing requests per "
                f"replica, {policy['min_replicas']}-{policy['max_replicas']} replicas")
    return str(policy.get("kind"))


def ray_autoscaling_flags(config: dict[str, Any]) -> list[str]:
    """options.deploy's flags for a Ray Serve autoscaling_config: min/max replicas as
    --min/--max-replicas, every other setting as --ray-autoscaling KEY=VALUE."""
    argv = ["--min-replicas", str(config["min_replicas"]), "--max-replicas", str(config["max_replicas"])]
    for key, value in config.items():
        if key not in ("min_replicas", "max_replicas"):
            argv += ["--ray-autoscaling", f"{key}={_number(value)}"]
    return argv


def deploy_command(level: int, policy: dict[str, Any], instance, model_id: str) -> dict[str, Any]:
    """The ``python -m options.deploy`` command that sets the simulated policy on rung ``level``:
    ``argv`` (after ``python -m options.deploy``), ``command`` (--target aws), ``plan_command``
    (--plan: the requests, nothing sent) and what to add or know. ``command`` is None where no
    deploy flag can express the policy."""
    notes: list[str] = []
    if policy.get("kind") == "bedrock_batch":
        return {"level": 1, "argv": None, "command": None, "plan_command": None,
                "notes": ["Bedrock batch inference has no options.deploy form: write the requests as JSONL to "
                          "S3 and submit a job (aws bedrock create-model-invocation-job --model-id "
                          f"{model_id} --input-data-config ... --output-data-config ...)"]}
    if policy.get("kind") == "bedrock_provisioned_throughput":
        term = {"none": "", "1month": " --commitment-duration OneMonth",
                "6month": " --commitment-duration SixMonths"}[policy["term"]]
        return {"level": 1, "argv": None, "command": None, "plan_command": None,
                "notes": [f"Provisioned Throughput has no options.deploy form: aws bedrock "
                          f"create-provisioned-model-throughput --model-id {model_id} --model-units "
                          f"{policy['model_units']}{term} --provisioned-model-name NAME, then invoke with "
                          "its ARN as the model id; it bills every hour until deleted"]}
    if level == 1:
        argv = ["--model", model_id, "--invoke", "Hello"]
        notes.append("Bedrock creates nothing: the command sends one request; the simulated limit is the "
                     "account's on-demand quota, raised through Service Quotas, not a deploy flag")
    elif level in SAGEMAKER_LEVELS:
        if policy["min_instances"] < 1 and level == 2:
            return {"level": level, "argv": None, "command": None, "plan_command": None,
                    "notes": ["the simulated policy keeps no instance when idle (--scale-to-zero: an inference "
                              "component at copy count 0), which options.deploy builds at levels 3-5 only: "
                              "level 2 deploys a JumpStart model on the variant, which keeps at least 1"]}
        argv = ["--instance-type", instance.sagemaker_name]
        if policy["min_instances"] < 1:      # the component's copies, between 0 and the maximum
            argv += ["--scale-to-zero"]
            notes.append("--scale-to-zero: the model runs as an inference component whose copies scale "
                         "between 0 and --autoscale-max; a NoCapacityInvocationFailures alarm adds the first "
                         "copy back, and the requests that find none fail, as the simulation counted them")
        elif policy["min_instances"] > 1:    # start at the floor, as the simulation did
            argv += ["--instance-count", str(policy["min_instances"])]
        bounds = (["--autoscale-min", str(policy["min_instances"])] if policy["min_instances"] >= 1 else [])
        argv += ["--autoscale-metric", _sagemaker_metric_names()[policy["metric"]],
                 *bounds, "--autoscale-max", str(policy["max_instances"]),
                 "--autoscale-target", _number(policy["target"])]
        notes.append("add --model: the model whose capacity the simulation used (level 2: its JumpStart id, "
                     "levels 3-5: a hub id or a local folder)")
        if level == 2:
            notes.append(f"JumpStart offers each model on some instance types only: --plan says so if "
                         f"{instance.sagemaker_name} is not one of them")
    elif policy.get("kind") == "ray_serve_ongoing_requests":
        argv = ["--instance-type", instance.name, "--engine", "rayservice",
                *ray_autoscaling_flags(policy["autoscaling_config"])]
        notes += ["add --model HF_ID and --image URI (the byo image with Ray, pushed to a registry)",
                  f"the simulation assumed a new replica serves {policy['replica_start_s']:g} s after Serve "
                  "asks for it (GPU node + image pull + model load); Serve itself decides every "
                  f"{policy['period_s']:g} s"]
    else:
        argv = ["--instance-type", instance.name,
                "--min-replicas", str(policy["min_replicas"]), "--max-replicas", str(policy["max_replicas"]),
                "--target-waiting", _number(policy["target"]), "--target-cpu", "0"]
        notes += ["--target-cpu 0: the simulation scaled on waiting requests alone; the HPA's CPU "
                  "fallback would add replicas it did not price",
                  "add --model HF_ID, and for --target aws --image URI (level 5 pushes the image to ECR)",
                  f"the simulation assumed the HPA's {policy.get('period_s', 15):g} s sync and "
                  f"{policy.get('scale_down_stabilization_s', 300):g} s scale-down stabilisation with no limit "
                  f"on pods added at once; the rendered HPA's behaviour section (infra/eks) sets its own"]
    apply = ["--level", str(level), "--target", "aws", *argv]
    return {"level": level, "argv": apply, "command": shlex.join([*DEPLOY, *apply]),
            "plan_command": shlex.join([*DEPLOY, "--level", str(level), "--plan", *argv]), "notes": notes}


def _flags(given: list[str], verb: str) -> str:
    return f"{', '.join(given)} {verb + 's' if len(given) == 1 else verb}"


def check_trace_flags(args) -> None:
    """With --trace, the profile flags of recommend's other form are refused, naming the ones given."""
    profile = [flag for flag, given in (("--avg", args.avg is not None), ("--peak", args.peak is not None),
                                        ("--tokens-per-month", args.tokens_per_month is not None),
                                        ("--hours-per-day", args.hours_per_day != 24.0)) if given]
    if profile:
        raise BadInput(f"{_flags(profile, 'describe')} a traffic profile, and --trace is the traffic itself: "
                       f"give one or the other")
    if args.min_replicas != 1:
        raise BadInput(f"--min-replicas {args.min_replicas} sizes recommend's fleet without a trace; with --trace "
                       f"the fleet's floor is --min-instances {args.min_replicas}")
    if args.mix:
        raise BadInput(f"--mix {args.mix} does not apply with --trace: the trace's own input and output sizes "
                       f"are its mix")


def refuse_simulation_flags(args) -> None:
    """Without --trace, simulate's flags (given away from their defaults, the trace's reading flags
    among them) would be silently ignored: refuse them, naming them."""
    import argparse

    from cost.simulate.cli import add_trace_simulation_arguments

    probe = argparse.ArgumentParser(add_help=False)
    add_trace_simulation_arguments(probe, eks_extended_support=False)
    given = [a.option_strings[0] for a in probe._actions
             if a.option_strings and a.dest != "trace" and getattr(args, a.dest, a.default) != a.default]
    if given:
        raise BadInput(f"{_flags(given, 'describe')} a simulation of a trace: add --trace FILE, or leave "
                       f"{'it' if len(given) == 1 else 'them'} out for the decision tree and --avg/--peak")


def recommend_from_simulation(req: Requirements, sim: dict[str, Any], min_savings_pct: float, instance,
                              model_id: str) -> dict[str, Any]:
    """The rung, its autoscaling and the command that deploys it, from ``cost.simulate``'s answer
    ``sim`` on a trace. ``instance`` is the priced InstanceType, ``model_id`` the Bedrock model."""
    floor = req.floor
    slo = sim["slo"]
    goal = slo["attainment"]
    within = _slo_text(slo)
    rows = {r["level"]: r for r in sim["rungs"]}
    if 1 in rows:
        rows[1] = bedrock_form(rows[1], goal)
    why = req.reasons() or ["no requirement given forces you past Bedrock: every simulated rung is a candidate"]
    allowed = {lv: r for lv, r in rows.items() if lv >= floor}
    if not allowed:
        raise BadInput(f"the requirements need rung {floor} or above, but --rungs simulated only "
                       f"{','.join(map(str, sorted(rows)))}: add rungs {floor}-6 to --rungs (e.g. --rungs "
                       f"{','.join(map(str, range(floor, 7)))})")
    if any(lv < floor for lv in rows):
        why.append(f"simulated but ruled out by the requirements: rung(s) "
                   f"{', '.join(str(lv) for lv in sorted(rows) if lv < floor)}")
    meeting = {lv: r for lv, r in allowed.items() if r["meets_slo"]}
    if meeting:
        level = min(meeting)
        for lv in sorted(allowed):
            if lv < level:
                why.append(f"rung {lv} misses the SLO: {allowed[lv]['slo_attainment']:.1%} of requests within "
                           f"{within}, below the {goal:.0%} asked")
        level = climb({lv: r["monthly_usd"] for lv, r in meeting.items()}, level, min_savings_pct, why)
        row = rows[level]
        why.append(f"it meets the SLO: {row['slo_attainment']:.1%} of requests within {within} (goal {goal:.0%})"
                   + ("; and it is the cheapest allowed rung that does" if row["monthly_usd"] ==
                      min(r["monthly_usd"] for r in meeting.values()) else ""))
    else:
        row = max(allowed.values(), key=lambda r: (r["slo_attainment"], -r["monthly_usd"], -r["level"]))
        level = row["level"]
        why.append(f"NO allowed rung meets the SLO ({within} for {goal:.0%} of requests): rung {level} comes "
                   f"closest, at {row['slo_attainment']:.1%}; raise --max-instances, loosen the SLO or take a "
                   f"larger --instance, and simulate again")
    flip = _simulation_flips(level, allowed, rows, sim, goal)
    if level == 2 and floor < 3 and 3 in allowed:
        flip.append("rungs 3-5 bill the same instance-hours: if the model is not a JumpStart one-click deploy, "
                    "rung 3 (your model on LMI) costs the same")
    flip += requirement_flips(req)
    policy = row["policy"]
    if level == 1 and "form" in row:
        why.append(f"as Bedrock {row['form'].replace('_', ' ')}: the cheapest of rung 1's simulated forms that "
                   "meets the SLO")
    out = {
        "level": level, "rung": RUNGS[level - 1].name, "tree_level": floor, "why": why, "flip": flip,
        **({"bedrock_form": row.get("form", "on_demand")} if level == 1 else {}),
        "min_savings_pct": min_savings_pct,
        "instance": None if level == 1 else instance.name if level == EKS_LEVEL else instance.sagemaker_name,
        "policy": policy,
        "monthly_usd": row["monthly_usd"], "window_usd": row["window_usd"],
        "slo_attainment": row["slo_attainment"], "meets_slo": row["meets_slo"],
        "ttft_ms": row["ttft_ms"], "e2e_ms": row["e2e_ms"], "replicas": row["replicas"],
        "deploy": deploy_command(level, policy, instance, model_id),
        "simulation": sim,
    }
    return out


def bedrock_form(row: dict[str, Any], goal: float) -> dict[str, Any]:
    """Rung 1 as the cheapest of its simulated forms that meets the SLO (on-demand, and batch or
    Provisioned Throughput where simulate was asked for them), compared per month as simulate's
    ``cheapest_bedrock_form`` is; on-demand when none of them meets it."""
    forms = [o for o in row.get("options", []) if o.get("meets_slo") and o.get("monthly_usd") is not None]
    if row["meets_slo"]:
        forms.append(row)
    if not forms:
        return row
    best = min(forms, key=lambda r: r["monthly_usd"])
    if best is row:
        return row
    return {**row, **{k: v for k, v in best.items() if k != "option"}, "level": 1, "replicas": None,
            "meets_slo": best["slo_attainment"] >= goal, "form": best["option"]}


def _simulation_flips(level: int, allowed: dict[int, dict], rows: dict[int, dict], sim: dict[str, Any],
                      goal: float) -> list[str]:
    chosen = rows[level]
    flips = []
    for lv, r in sorted(allowed.items()):
        if lv != level and not r["meets_slo"] and r["monthly_usd"] < chosen["monthly_usd"]:
            flips.append(f"rung {lv} would cost ${r['monthly_usd']:,.2f}/month "
                         f"({1 - r['monthly_usd'] / chosen['monthly_usd']:.0%} less) but meets the SLO for "
                         f"{r['slo_attainment']:.1%} of requests: with a looser SLO (or --slo-attainment) it "
                         f"would be a candidate")
    bedrock = allowed.get(1)
    if bedrock is not None and level != 1 and bedrock["throttled"] and "form" not in bedrock:
        tpm = bedrock["policy"].get("tpm")
        flips.append(f"Bedrock throttled {bedrock['throttled']:,} of {sim['trace']['requests']:,} requests"
                     + (f" at {tpm:,.0f} tokens/minute" if tpm else "")
                     + ": with a quota raised through Service Quotas, simulate again with --bedrock-tpm N")
    scales = sim.get("break_even_scale") or {}
    if level == 1:
        for lv in sorted(allowed):
            k = scales.get(str(lv))
            if lv != 1 and k is not None:
                flips.append(f"above --scale {k:g} (this trace's rate x {k:g}) rung {lv} would cost less "
                             f"than Bedrock, holding its per-instance load")
    elif scales.get(str(level)) is not None and 1 in allowed:
        k = scales[str(level)]
        flips.append(f"below --scale {k:g} (this trace's rate x {k:g}) Bedrock would cost less than rung "
                     f"{level}, had it met the SLO")
    return flips


def render_trace(data: dict[str, Any]) -> None:
    """The answer for people: rung, instance, policy, cost and SLO, the deploy command, why and
    what would flip it, then the simulated rungs' table and its assumptions."""
    from cost.render import console
    from cost.simulate.cli import render_simulation

    mark = "[green]meets the SLO[/green]" if data["meets_slo"] else "[red]misses the SLO[/red]"
    console.print(f"[bold]Recommended: rung {data['level']} — {data['rung']}[/bold]"
                  + (f" (the decision tree alone says rung {data['tree_level']})"
                     if data["tree_level"] != data["level"] else ""), highlight=False)
    if data["instance"]:
        console.print(f"  instance:    {data['instance']}", highlight=False)
    console.print(f"  autoscaling: {policy_text(data['level'], data['policy'])}", highlight=False)
    console.print(f"  cost:        ${data['monthly_usd']:,.2f}/month (${data['window_usd']:,.2f} for the trace)",
                  highlight=False)
    ttft, e2e = data["ttft_ms"], data["e2e_ms"]
    ms = lambda v: "—" if v is None else f"{v:,.0f}"  # noqa: E731
    console.print(f"  SLO:         {mark}: {data['slo_attainment']:.1%} of requests; TTFT p50/p99 "
                  f"{ms(ttft['p50'])} / {ms(ttft['p99'])} ms, E2E p50/p99 {ms(e2e['p50'])} / {ms(e2e['p99'])} ms",
                  highlight=False)
    deploy = data["deploy"]
    console.print("[bold]Deploy it[/bold]")
    if deploy["command"]:
        # soft_wrap: a command wrapped over lines would not paste back as one
        console.print("  " + deploy["command"], soft_wrap=True, highlight=False, markup=False)
        if deploy["plan_command"]:
            console.print("  its requests first, nothing sent:", highlight=False)
            console.print("  " + deploy["plan_command"], soft_wrap=True, highlight=False, markup=False)
    for note in deploy["notes"]:
        console.print(f"  • {note}", highlight=False)
    console.print("[bold]Why[/bold]")
    for line in data["why"]:
        console.print(f"  • {line}", highlight=False)
    if data["flip"]:
        console.print("[bold]What would flip it[/bold]")
        for line in data["flip"]:
            console.print(f"  • {line}", highlight=False)
    render_simulation({**data["simulation"], "assumptions": data.get("assumptions", [])})
