#!/usr/bin/env python3
"""The official Python SDKs read whole answers through stormguard-gateway.

The gateway (`stormguard-gateway demo --listen ADDR`) serves the model `demo` in OpenAI's format
and `demo-claude` in Anthropic's, each on two ranks of mock providers it embeds: a flaky one,
which fails every third whole request of each API (a 500 or 529, then a 429 with Retry-After)
and cuts every third stream after a few words, and a backup that never fails. The gateway retries
what failed and continues each cut stream on the backup, splicing the rest in. This script sends
N streamed answers and a few whole ones through each SDK, exactly as an application would (the
SDKs' own retries off, `base_url` at the gateway), and checks that every answer is the mock's whole
text, every counted word once, in order, that some streams went through a cut (the flaky provider
names what it did in the `x-demo-fault` header, which the gateway relays) and that some whole
answers took a retry (`x-stormguard-attempts`).

It starts nothing itself: `examples/sdk/run.sh` builds and starts the gateway and runs it.

    python3 stream_check.py http://127.0.0.1:4000          # or STORMGUARD_GATEWAY=...

Exit status: 0 when every answer is whole, at least one stream was continued after a cut and at
least one whole answer was retried; 1 otherwise (each problem is printed), 2 for a usage error.
"""

import argparse
import os
import sys
from dataclasses import dataclass, field

import anthropic
import openai

# The header in which the demo's flaky provider names what it did to an answer, and what it says
# of a stream it cut ("stream cut after word 4").
DEMO_FAULT = "x-demo-fault"
CUT = "stream cut"
# The header in which the gateway says how many attempts an answer took.
ATTEMPTS = "x-stormguard-attempts"
OPENAI_MODEL = "demo"
ANTHROPIC_MODEL = "demo-claude"
# Each SDK's own retries are off: stormguard retries in the gateway, and an SDK retry would hide
# an answer that failed.
CLIENT_OPTIONS = {"api_key": "test", "max_retries": 0, "timeout": 30.0}


def expected_text(tokens):
    """The mock's whole answer of `tokens` tokens: it counts, one word a token."""
    return " ".join(str(n) for n in range(1, tokens + 1))


def tokens_of(request):
    """The max_tokens of the request numbered `request`: 8 to 24, so that cuts fall at
    different places."""
    return 8 + 4 * (request % 5)


def prompt(request):
    return [{"role": "user", "content": f"Say hello ({request})"}]


@dataclass
class Answer:
    """What one request gave: its text, whether it went through a fault (a streamed answer the
    flaky provider cut, a whole answer that took a retry), and what else it said that a whole
    answer must say (problems found on the way)."""

    text: str
    faulted: bool
    problems: list = field(default_factory=list)


def openai_answer(client, request):
    """One streamed chat completion, read chunk by chunk."""
    tokens = tokens_of(request)
    stream = client.chat.completions.create(
        model=OPENAI_MODEL, messages=prompt(request), max_tokens=tokens, stream=True
    )
    cut = stream.response.headers.get(DEMO_FAULT, "").startswith(CUT)
    parts, finishes, ids = [], [], set()
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    answer = Answer("".join(parts), cut)
    if len(finishes) != 1:
        answer.problems.append(f"{len(finishes)} chunks with a finish_reason, not 1")
    if len(ids) != 1:
        answer.problems.append(f"chunks of {len(ids)} completions ({sorted(ids)}), not 1")
    return answer


def anthropic_answer(client, request):
    """One streamed message, read with the SDK's stream helper, which also assembles the final
    message from the events (so a block or usage the splice got wrong shows there)."""
    tokens = tokens_of(request)
    with client.messages.stream(
        model=ANTHROPIC_MODEL, messages=prompt(request), max_tokens=tokens
    ) as stream:
        cut = stream.response.headers.get(DEMO_FAULT, "").startswith(CUT)
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    answer = Answer(text, cut)
    blocks = [block.text for block in message.content if block.type == "text"]
    if blocks != [text]:
        answer.problems.append(f"the final message's text blocks are {blocks!r}")
    if message.stop_reason != "end_turn":
        answer.problems.append(f"stop_reason {message.stop_reason!r}, not 'end_turn'")
    if message.usage.output_tokens != tokens:
        answer.problems.append(f"usage.output_tokens {message.usage.output_tokens}, not {tokens}")
    return answer


def retried(raw):
    """Whether the gateway says the answer took more than one attempt."""
    return int(raw.headers.get(ATTEMPTS, "1")) > 1


def openai_whole(client, request):
    """One chat completion, not streamed, with its headers."""
    raw = client.chat.completions.with_raw_response.create(
        model=OPENAI_MODEL, messages=prompt(request), max_tokens=tokens_of(request)
    )
    completion = raw.parse()
    return Answer(completion.choices[0].message.content or "", retried(raw))


def anthropic_whole(client, request):
    """One message, not streamed, with its headers."""
    raw = client.messages.with_raw_response.create(
        model=ANTHROPIC_MODEL, messages=prompt(request), max_tokens=tokens_of(request)
    )
    message = raw.parse()
    text = "".join(block.text for block in message.content if block.type == "text")
    return Answer(text, retried(raw))


def text_problem(text, tokens):
    """What is wrong with `text` as the whole answer of `tokens` tokens, or None."""
    want = expected_text(tokens).split(" ")
    got = text.split(" ")
    if got == want:
        return None
    for n, (word, wanted) in enumerate(zip(got, want)):
        if word != wanted:
            return (
                f"word {n + 1} is {word!r}, not {wanted!r} ({len(got)} words, {len(want)} "
                f"expected): {text!r}"
            )
    if len(got) > len(want):
        return f"{len(got) - len(want)} words too many (a word sent twice?): {text!r}"
    return f"{len(want) - len(got)} words missing (a truncated answer): {text!r}"


@dataclass
class Tally:
    """What one SDK's requests of one kind gave (`streamed`: streamed answers, else whole)."""

    name: str
    streamed: bool
    whole: int = 0
    faulted: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def fault(self):
        return "through a cut" if self.streamed else "after a retry"


def run(name, read, client, requests, streamed=True):
    """Sends `requests` requests through `read`: what they gave."""
    tally = Tally(name, streamed)
    for request in range(requests):
        tokens = tokens_of(request)
        try:
            answer = read(client, request)
        except Exception as error:  # noqa: BLE001 - any failure of the SDK is a finding
            tally.failures.append(f"request {request} ({tokens} tokens) raised {error!r}")
            continue
        problems = list(answer.problems)
        wrong = text_problem(answer.text, tokens)
        if wrong:
            problems.insert(0, wrong)
        if answer.faulted:
            tally.faulted.append(request)
        if problems:
            how = tally.fault() if answer.faulted else "no fault"
            tally.failures.append(f"request {request} ({tokens} tokens, {how}): " + "; ".join(problems))
        else:
            tally.whole += 1
    return tally


def report(tally, requests):
    faulted = ", ".join(map(str, tally.faulted)) or "none"
    kind = "streamed" if tally.streamed else "whole (not streamed)"
    print(
        f"{tally.name}: {tally.whole}/{requests} {kind} answers whole, every word once, in "
        f"order; {len(tally.faulted)} of them {tally.fault()} (requests {faulted})"
    )
    for failure in tally.failures:
        print(f"  FAILED {failure}")


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "gateway",
        nargs="?",
        default=os.environ.get("STORMGUARD_GATEWAY"),
        help="the gateway's base URL, such as http://127.0.0.1:4000 (default: $STORMGUARD_GATEWAY)",
    )
    parser.add_argument("--requests", type=int, default=24, help="streamed requests per SDK")
    parser.add_argument("--whole", type=int, default=6, help="whole (not streamed) requests per SDK")
    args = parser.parse_args()
    if not args.gateway:
        parser.error("give the gateway's base URL, or set STORMGUARD_GATEWAY")
    args.gateway = args.gateway.rstrip("/")
    return args


def main():
    args = arguments()
    print(
        f"{args.requests} streamed and {args.whole} whole requests per SDK through {args.gateway} "
        f"(openai {openai.__version__}, anthropic {anthropic.__version__})"
    )
    chat = openai.OpenAI(base_url=f"{args.gateway}/v1", **CLIENT_OPTIONS)
    messages = anthropic.Anthropic(base_url=args.gateway, **CLIENT_OPTIONS)
    streams = [
        run("openai chat.completions", openai_answer, chat, args.requests),
        run("anthropic messages", anthropic_answer, messages, args.requests),
    ]
    wholes = [
        run("openai chat.completions", openai_whole, chat, args.whole, streamed=False),
        run("anthropic messages", anthropic_whole, messages, args.whole, streamed=False),
    ]
    for tally in streams:
        report(tally, args.requests)
    for tally in wholes:
        report(tally, args.whole)
    failed = sum(len(tally.failures) for tally in streams + wholes)
    cuts = sum(len(tally.faulted) for tally in streams)
    retries = sum(len(tally.faulted) for tally in wholes)
    if failed:
        print(f"SDK check FAILED: {failed} answers were not whole (see above)")
        return 1
    if cuts == 0 or (args.whole > 0 and retries == 0):
        print(
            f"SDK check FAILED: {cuts} streams went through a cut and {retries} whole answers "
            "through a retry, so this run shows nothing about continuation or retries (is the "
            "gateway running `demo`?)"
        )
        return 1
    print(
        f"SDK check passed: every answer whole, {cuts} streams continued after a cut, "
        f"{retries} whole answers retried"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
