#!/usr/bin/env python3
"""The official Python SDKs read whole answers through the stormguard gateway example.

The gateway (`axum_gateway --stream --listen ADDR`) relays OpenAI's `/v1/chat/completions` and
Anthropic's `/v1/messages` to a mock provider that cuts some streams after content. stormguard's
client in the gateway continues each cut stream and splices the rest in. This script streams N
answers through each SDK, exactly as an application would, and checks that every answer is the
mock's whole text, every word once, in order, and that some of them went through a cut (the mock
names the fault it injected in the `x-mock-fault` header of the answer it cut, which the gateway
relays).

It starts nothing itself: `examples/sdk/run.sh` starts the gateway and runs it.

    python3 stream_check.py http://127.0.0.1:8080          # or STORMGUARD_GATEWAY=...

Exit status: 0 when every answer is whole and at least one went through a cut, 1 otherwise
(each problem is printed), 2 for a usage error.
"""

import argparse
import os
import sys
from dataclasses import dataclass, field

import anthropic
import openai

# The mock's sentence (examples/src/mock/events.rs): a streamed answer's n-th token is its n-th
# word, repeated as long as max_tokens asks.
WORDS = ["This", "is", "the", "mock", "speaking."]
# The header in which the mock names the fault it failed an answer with.
MOCK_FAULT = "x-mock-fault"
CUT = "cut_mid_stream"
# Each SDK's own retries are off: stormguard retries in the gateway, and an SDK retry would hide
# an answer that failed.
CLIENT_OPTIONS = {"api_key": "test", "max_retries": 0, "timeout": 30.0}


def expected_text(tokens):
    """The mock's whole answer of `tokens` tokens."""
    return " ".join(WORDS[n % len(WORDS)] for n in range(tokens))


def tokens_of(request):
    """The max_tokens of the request numbered `request`: 8 to 24, so that cuts fall at
    different places."""
    return 8 + 4 * (request % 5)


def prompt(request):
    return [{"role": "user", "content": f"Say hello ({request})"}]


@dataclass
class Answer:
    """What one streamed request gave: its text, whether the mock cut it, and what else the
    stream said that a whole answer must say (problems found on the way)."""

    text: str
    cut: bool
    problems: list = field(default_factory=list)


def openai_answer(client, request):
    """One streamed chat completion, read chunk by chunk."""
    tokens = tokens_of(request)
    stream = client.chat.completions.create(
        model="mock-1", messages=prompt(request), max_tokens=tokens, stream=True
    )
    cut = stream.response.headers.get(MOCK_FAULT) == CUT
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
        model="claude-mock", messages=prompt(request), max_tokens=tokens
    ) as stream:
        cut = stream.response.headers.get(MOCK_FAULT) == CUT
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
    """What one SDK's requests gave."""

    name: str
    whole: int = 0
    cut: list = field(default_factory=list)
    failures: list = field(default_factory=list)


def run(name, read, client, requests):
    """Sends `requests` streamed requests through `read`: what they gave."""
    tally = Tally(name)
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
        if answer.cut:
            tally.cut.append(request)
        if problems:
            how = "cut and continued" if answer.cut else "not cut"
            tally.failures.append(f"request {request} ({tokens} tokens, {how}): " + "; ".join(problems))
        else:
            tally.whole += 1
    return tally


def report(tally, requests):
    cut = ", ".join(map(str, tally.cut)) or "none"
    print(
        f"{tally.name}: {tally.whole}/{requests} streamed answers whole, every word once, in "
        f"order; {len(tally.cut)} of them through a cut (requests {cut})"
    )
    for failure in tally.failures:
        print(f"  FAILED {failure}")


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "gateway",
        nargs="?",
        default=os.environ.get("STORMGUARD_GATEWAY"),
        help="the gateway's base URL, such as http://127.0.0.1:8080 (default: $STORMGUARD_GATEWAY)",
    )
    parser.add_argument("--requests", type=int, default=24, help="streamed requests per SDK")
    args = parser.parse_args()
    if not args.gateway:
        parser.error("give the gateway's base URL, or set STORMGUARD_GATEWAY")
    args.gateway = args.gateway.rstrip("/")
    return args


def main():
    args = arguments()
    print(
        f"{args.requests} streamed requests per SDK through {args.gateway} "
        f"(openai {openai.__version__}, anthropic {anthropic.__version__})"
    )
    chat = openai.OpenAI(base_url=f"{args.gateway}/v1", **CLIENT_OPTIONS)
    messages = anthropic.Anthropic(base_url=args.gateway, **CLIENT_OPTIONS)
    tallies = [
        run("openai chat.completions", openai_answer, chat, args.requests),
        run("anthropic messages", anthropic_answer, messages, args.requests),
    ]
    for tally in tallies:
        report(tally, args.requests)
    failed = sum(len(tally.failures) for tally in tallies)
    cuts = sum(len(tally.cut) for tally in tallies)
    if failed:
        print(f"SDK check FAILED: {failed} answers were not whole (see above)")
        return 1
    if cuts == 0:
        print(
            "SDK check FAILED: no answer went through a cut, so this run shows nothing about "
            "continuation (is the gateway running with --stream?)"
        )
        return 1
    print(f"SDK check passed: every answer whole, {cuts} of them continued after a cut")
    return 0


if __name__ == "__main__":
    sys.exit(main())
