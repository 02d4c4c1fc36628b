"""The options more than one command takes, each declared once here: its flag, default,
bounds and help. A command module takes them from here (`repeats: int = RepeatsOpt(...)`);
an option only one command has is declared in that command. Where commands word an
option's help for what they apply it to, its declaration here is a function taking that
word (`RepeatsOpt("the starting state")`): one flag, one default, one bound.
"""

from typing import Callable, Optional

import typer

from patchset.isolate.measure.driftdecide import MAX_REPLAYS, MIN_REPLAYS

# ---------------------------------------------------------------- the series and selection

SeriesOpt = typer.Option(None, "--series", help="patches.yaml to use "
                         "[default: ./patches.yaml or $PATCHSET_SERIES]")
TierOpt = typer.Option(None, "--tier", help="safe | moderate | risky (cumulative)")
PathOpt = typer.Option(None, "--path", help="prefill | decode | both")
OnlyOpt = typer.Option(None, "--only", help="only these patches (A,B or repeated)")
ExcludeOpt = typer.Option(None, "--exclude", help="leave these patches out (A,B or repeated)")
JsonOpt = typer.Option(False, "--json", help="machine-readable output on stdout")
TargetOpt = typer.Option(None, "--target", help="tree to manage on localhost "
                         "[default: the provisioned tree under $PATCHSET_HOME]")


def OfflineOpt(meaning: str = ""):  # noqa: N802 - an Option
    """--offline, with what it means for the command (`a release from the cache`)."""
    return typer.Option(False, "--offline", help="never touch the network"
                        + (f" ({meaning})" if meaning else ""))


def NewTierOpt(of: str):  # noqa: N802 - an Option
    """--tier of the patches a command writes (import, adopt, capture)."""
    return typer.Option("risky", "--tier", help=f"tier of {of}")


def NewPathOpt(of: str):  # noqa: N802 - an Option
    """--path of the patches a command writes (import, adopt, capture)."""
    return typer.Option("both", "--path", help=f"path of {of}")

# ---------------------------------------------------------------- number checks

MAX_SECONDS = 7 * 24 * 3600


def within(lo: float, hi: float, what: str) -> Callable[[Optional[float]], Optional[float]]:
    """The callback of every float option: a finite number in lo..hi. typer's float parser
    takes `nan` (and its min/max let nan through: every comparison with it is false), `inf`
    and `-1`, which would wait forever, never, or judge nothing."""
    def check(value: Optional[float]) -> Optional[float]:
        if value is not None and not lo <= value <= hi:         # False for nan too
            raise typer.BadParameter(f"{value!r} is not {what} ({lo:g} to {hi:g})")
        return value
    return check


seconds = within(0, MAX_SECONDS, "a number of seconds")


def SecondsOpt(default: Optional[float], *flags: str, help: str):  # noqa: N802 - an Option
    return typer.Option(default, *flags, help=help, callback=seconds)


# One HTTP exchange (a probe's request, a serve client's connection): each is one
# deadline (patchset/agent/lib/httpdeadline.py); 0 would fail every request and more than a
# day is a typo, not a wait.
MIN_REQUEST_SECONDS, MAX_REQUEST_SECONDS = 0.001, 24 * 3600
request_seconds = within(MIN_REQUEST_SECONDS, MAX_REQUEST_SECONDS,
                         "a request's timeout in seconds")


def RequestSecondsOpt(default: float, *flags: str, help: str):  # noqa: N802 - an Option
    return typer.Option(default, *flags, help=help, callback=request_seconds)


# ---------------------------------------------------------------- the drift measurement
# (isolate/measure/drift.py, driftdecide.py: probe --kind drift, bisect --probe drift,
# rollout's drift gate)

SigmasOpt = typer.Option(3.0, "--sigmas", callback=within(0.5, 10.0, "a number of sigmas"),
                         help="drift: how many standard errors above the noise make a drift "
                         "(or a bisect's contribution) real")
OutputTokensOpt = typer.Option(256, "--output-tokens", min=1, max=32768,
                               help="drift: tokens generated per sequence")
ToleranceOpt = typer.Option(0.002, "--tolerance",
                            callback=within(1e-12, 10.0, "a drift per token"),
                            help="drift: the drift per token that matters; a drift bounded "
                            "below it is `bounded` (default: SGLang's own KL gate)")
ConfidenceOpt = typer.Option(0.99, "--confidence",
                             callback=within(0.5, 0.9999, "a confidence"),
                             help="drift: one-sided confidence of `above` and `bounded`")
BudgetOpt = typer.Option(48, "--budget", min=0, max=2048,
                         help="drift: sequences at most; rounds of conversations are added "
                         "until the outcome is decided (0: the shipped conversations once)")


def RepeatsOpt(of: str):  # noqa: N802 - an Option
    """--repeats: how many times the drift measurement replays `of` (probe: each sequence,
    bisect: the starting state, rollout: the baseline's tokens). The one bound is the
    decision's (driftdecide.MIN_REPLAYS: the noise is replay 1 against replay 0)."""
    return typer.Option(3, "--repeats", min=MIN_REPLAYS, max=MAX_REPLAYS,
                        help=f"drift: replays of {of} (their spread is the noise)")


# ---------------------------------------------------------------- hosts and time

ForksOpt = typer.Option(16, "--forks", min=1, max=256,
                        help="hosts worked on at once (restarts stay host by host)")
LockWaitOpt = SecondsOpt(0.0, "--lock-wait", help="seconds to wait for another patchset "
                         "run on the same target")
HealthTimeoutOpt = SecondsOpt(None, "--health-timeout", help="seconds to wait for each "
                              "unit's /health [the role's health_timeout, else its "
                              "TimeoutStartSec]")

# ---------------------------------------------------------------- probes and the audit

ApiKeyEnvOpt = typer.Option(None, "--api-key-env", help="read the endpoint's API key from "
                            "this environment variable (the key is never shown)")
ProbeTimeoutOpt = RequestSecondsOpt(600.0, "--probe-timeout",
                                    help="seconds per probe request, all of it")
UrlOpt = typer.Option(None, "--url", help="the endpoint to probe: any OpenAI-compatible "
                      "server, e.g. http://127.0.0.1:30000 [default: the host's router, "
                      "else decode, role port]")
AuditProbeOpt = typer.Option(None, "--probe", help="also run the fidelity probes of "
                             "`patchset probe` in every audit, against each host's "
                             "endpoint: recall | needle | all | drift")


def SizesOpt(flag: str):  # noqa: N802 - an Option
    """The probes' prompt sizes: --sizes (probe, bisect), --probe-sizes (audit, serve)."""
    return typer.Option(None, flag, help="needle prompt sizes in tokens, and the drift "
                        "conversations' [8k,16k,32k]")

WaiversOpt = typer.Option(None, "--waivers", help="the waivers file (default: ./waivers.yaml "
                          "when it exists): findings accepted on purpose, shown as waived, "
                          "not counted in the exit code")
NoWaiversOpt = typer.Option(False, "--no-waivers", help="read no waivers file")

InventoryOpt = typer.Option(None, "--inventory", help="hosts.yaml [default: ./hosts.yaml or "
                            "$PATCHSET_INVENTORY]")
AcceptNewOpt = typer.Option(False, "--accept-new", help="record the key of a host seen for "
                            "the first time (a changed key is always refused)")
