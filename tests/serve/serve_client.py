#!/usr/bin/env python3
"""Client side of the `serve` stage (scripts/stages/serve.sh): Python's standard library only.

Each subcommand runs one group of checks against a running `deepinfer serve` and prints one
PASS/FAIL line per check (the format of the other stages); the exit code is 1 if any failed.
Every check compares against something the server did not produce itself: `deepinfer generate`
and `deepinfer tokenize`, the same request sent alone, the text before a stop string, a saved
answer from another server, or the numbers in /metrics.

  serve_client.py generate   --port P --deepinfer BIN --model DIR
  serve_client.py stream     --port P
  serve_client.py stop       --port P
  serve_client.py errors     --port P
  serve_client.py auth       --port P --key K --name NAME
  serve_client.py busy       --port P --kv-pages N
  serve_client.py concurrent --port P [--where W] [--save FILE] [--compare FILE --label L]
  serve_client.py disconnect --port P
  serve_client.py health     --port P --timeout S [--key K]   (started before the server listens)
  serve_client.py sigterm    --port P --pid PID
  serve_client.py failover   --host H --port P --then CMD   (CMD fails a rank's host: multihost stage)
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
TIMEOUT = 60
failed = False
MODEL_NAME = "tiny"  # --name: the server's --served-model-name
AUTH = {}  # --key: the header complete() sends

# Prompts for the batch-invariance checks: 16 different ones, of different lengths.
PROMPTS16 = [
    "The GNU General Public License is a free, copyleft license for",
    "This program is free software: you can redistribute it and/or modify",
    "Everyone is permitted to copy and distribute verbatim copies",
    "The licenses for most software and other practical works are designed",
    "When we speak of free software, we are referring to freedom, not",
    "To protect your rights, we need to prevent others from denying you",
    "For example, if you distribute copies of such a program, whether gratis or for a fee,",
    "Developers that use the GNU GPL protect your rights with two steps:",
    "For the developers' and authors' protection, the GPL clearly explains",
    "Some devices are designed to deny users access to install or run",
    "Finally, every program is threatened constantly by software patents.",
    "The precise terms and conditions for copying, distribution and modification follow.",
    "Copyright",
    "A \"covered work\" means either the unmodified Program or a work based on the Program.",
    "You may make, run and propagate covered works that you do not convey,",
    "Each time you convey a covered work, the recipient automatically receives a license",
]


def report(name, ok, detail=""):
    global failed
    detail = detail.replace("\n", "\\n")
    print("%-4s %-52s %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)
    if not ok:
        failed = True


def skip(name, detail):
    print("%-4s %-52s %s" % ("SKIP", name, detail), flush=True)


def short(x, n=160):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


class Reply:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body.decode("utf-8"))


def request(port, method, path, body=None, headers=None, timeout=TIMEOUT):
    """One HTTP request; body: bytes, or an object sent as JSON. Returns a Reply."""
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        try:
            c.request(method, path, body=body, headers=h)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) before it has read the whole body
        r = c.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        c.close()


def complete(port, body, path="/v1/completions", headers=None):
    """A non-streamed request that must succeed: (text, choice, response json)."""
    r = request(port, "POST", path, body, AUTH if headers is None else headers)
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, short(r.body.decode("utf-8", "replace"))))
    j = r.json()
    c = j["choices"][0]
    text = c["message"]["content"] if "message" in c else c["text"]
    return text, c, j


def greedy(prompt, max_tokens=24, **extra):
    b = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    b.update(extra)
    return b


class Stream:
    """An SSE response read event by event; every `data:` payload is checked to be strict
    UTF-8 and (except [DONE]) JSON."""

    def __init__(self, port, body, path="/v1/completions", headers=None):
        body = dict(body, stream=True)
        self.conn = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.problems = []  # not UTF-8, not JSON, or not an SSE line
        self.done = False

    def events(self):
        """Yields each data payload: a parsed JSON object, or the string '[DONE]'."""
        if self.status != 200:
            return
        while True:
            line = self.resp.readline()
            if not line:
                return
            if line in (b"\n", b"\r\n"):
                continue
            if not line.startswith(b"data: "):
                self.problems.append("not a data line: %r" % line[:80])
                continue
            raw = line[len(b"data: "):].rstrip(b"\r\n")
            try:
                s = raw.decode("utf-8", "strict")
            except UnicodeDecodeError as e:
                self.problems.append("not UTF-8: %s" % e)
                continue
            if s == "[DONE]":
                self.done = True
                yield s
                continue
            try:
                yield json.loads(s)
            except ValueError as e:
                self.problems.append("not JSON: %s: %r" % (e, s[:80]))

    def read_all(self):
        """(chunks, text, finish_reason) over the whole stream."""
        chunks, text, finish = [], "", None
        for ev in self.events():
            if ev == "[DONE]":
                chunks.append(ev)
                continue
            chunks.append(ev)
            for c in ev.get("choices", []):
                if "delta" in c:
                    text += c["delta"].get("content") or ""
                else:
                    text += c.get("text") or ""
                if c.get("finish_reason") is not None:
                    finish = c["finish_reason"]
        self.close()
        return chunks, text, finish

    def close(self):
        self.conn.close()


def error_shape(r):
    """'' when r's body is {"error": {"message", "type", "param", "code"}}, else what is wrong."""
    try:
        j = r.json()
    except ValueError:
        return "body is not JSON: %s" % short(r.body)
    e = j.get("error") if isinstance(j, dict) else None
    if not isinstance(e, dict):
        return "no 'error' object: %s" % short(j)
    if set(e) != {"message", "type", "param", "code"}:
        return "error keys %s" % sorted(e)
    if not isinstance(e["message"], str) or not e["message"]:
        return "empty message"
    if not isinstance(e["type"], str) or not e["type"]:
        return "no type"
    for k in ("param", "code"):
        if e[k] is not None and not isinstance(e[k], str):
            return "%s is %r" % (k, e[k])
    return ""


def expect_error(name, r, status, param=None, message_re=None, type_=None):
    why = ""
    if r.status != status:
        why = "HTTP %d, want %d" % (r.status, status)
    else:
        why = error_shape(r)
    if not why:
        e = r.json()["error"]
        if param is not None and e["param"] != param:
            why = "param %r, want %r" % (e["param"], param)
        elif type_ is not None and e["type"] != type_:
            why = "type %r, want %r" % (e["type"], type_)
        elif message_re is not None:
            if not re.search(message_re, e["message"]):
                why = "message %r lacks /%s/" % (e["message"], message_re)
    detail = why or "%d %s" % (r.status, short(r.json()["error"]["message"], 100))
    report(name, not why, detail)


def metrics(port):
    r = request(port, "GET", "/metrics")
    out = {}
    for line in r.body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        out[k] = float(v)
    return out


# ---------------------------------------------------------------- 1. greedy = generate

GEN_PROMPTS = [
    "The GNU General Public License is a free, copyleft license for",
    "This program is distributed in the hope that it will be useful,",
    "You should have received a copy of the GNU General Public License",
]


def run_cli(args, cmd):
    p = subprocess.run([args.deepinfer] + cmd, capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr[-300:]))
    return p.stdout.decode("utf-8")


def cmd_generate(args):
    port = args.port
    for i, prompt in enumerate(GEN_PROMPTS):
        # generate echoes the prompt, then streams the continuation, then a newline.
        out = run_cli(args, ["generate", "--model", args.model, "--prompt", prompt,
                             "--max-tokens", "24"])
        want = out[len(prompt):-1] if out.startswith(prompt) and out.endswith("\n") else None
        text, c, j = complete(port, greedy(prompt))
        report("completion = generate (prompt %d)" % i, want is not None and text == want,
               "%r (finish %s)" % (short(text, 60), c["finish_reason"]) if text == want
               else "server %r, generate %r" % (text, out))
        if i == 0:
            ids = [int(x) for x in run_cli(args, ["tokenize", "--model", args.model,
                                                  "--text", prompt]).split()]
            t2, _, j2 = complete(port, greedy(ids))
            report("token-id prompt = string prompt", t2 == text and
                   j2["usage"]["prompt_tokens"] == len(ids) == j["usage"]["prompt_tokens"],
                   "%d ids" % len(ids) if t2 == text else "ids: %r, string: %r" % (t2, text))
            t3, c3, _ = complete(port, greedy(prompt, ignore_eos=True))
            # Without an EOS in the first 24 tokens, ignore_eos changes nothing.
            ok = c3["finish_reason"] == "length" and (
                t3 == text if c["finish_reason"] == "length" else t3.startswith(text))
            report("ignore_eos: the same tokens up to EOS", ok,
                   "finish %s / %s" % (c["finish_reason"], c3["finish_reason"]))
    # Chat: one user message in the model's chat format, as `generate --chat` builds it.
    q = "What is the GPL?"
    out = run_cli(args, ["generate", "--model", args.model, "--chat", "--prompt", q,
                         "--max-tokens", "24"])
    want = out[len(q):-1] if out.startswith(q) and out.endswith("\n") else None
    text, c, _ = complete(port, {"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                                 "temperature": 0}, "/v1/chat/completions")
    ok = text == want and c["message"]["role"] == "assistant"
    report("chat completion = generate --chat", ok,
           "%r (finish %s)" % (short(text, 60), c["finish_reason"]) if ok
           else "server %r, generate %r" % (text, out))


# ---------------------------------------------------------------- 2. streaming


def cmd_stream(args):
    port = args.port
    for i, prompt in enumerate(GEN_PROMPTS[:2]):
        want, c, _ = complete(port, greedy(prompt))
        s = Stream(port, greedy(prompt))
        chunks, text, finish = s.read_all()
        ok = s.status == 200 and not s.problems and text == want and s.done and \
            chunks[-1] == "[DONE]" and finish == c["finish_reason"]
        report("stream (prompt %d) = non-streamed, ends [DONE]" % i, ok,
               "%d chunks" % len(chunks) if ok else "HTTP %d %s: %r vs %r, finish %s/%s, done %s"
               % (s.status, s.problems[:2], text, want, finish, c["finish_reason"], s.done))
    # include_usage: the last chunk before [DONE] has the usage and no choices.
    s = Stream(port, greedy(GEN_PROMPTS[0], max_tokens=20, ignore_eos=True,
                            stream_options={"include_usage": True}))
    chunks, text, finish = s.read_all()
    ok, why = False, ""
    if len(chunks) >= 2 and chunks[-1] == "[DONE]":
        last = chunks[-2]
        u = last.get("usage") or {}
        ok = last.get("choices") == [] and u.get("completion_tokens") == 20 and \
            u.get("total_tokens") == u.get("prompt_tokens", 0) + 20 and \
            all(ch.get("usage", 0) is None for ch in chunks[:-2]) and finish == "length"
        why = "usage %s" % u
    report("stream include_usage: last chunk's usage", ok and not s.problems,
           why + (" %s" % s.problems[:2] if s.problems else ""))
    # Chat: the first delta says role assistant; the content adds up to the non-streamed one.
    body = {"messages": [{"role": "system", "content": "You answer briefly."},
                         {"role": "user", "content": "What is free software?"}],
            "max_tokens": 24, "temperature": 0}
    want, c, _ = complete(port, body, "/v1/chat/completions")
    s = Stream(port, body, "/v1/chat/completions")
    chunks, text, finish = s.read_all()
    first = chunks[0]["choices"][0]["delta"] if chunks and chunks[0] != "[DONE]" else {}
    ok = first.get("role") == "assistant" and text == want and finish == c["finish_reason"] and \
        s.done and not s.problems and all(
            ch["object"] == "chat.completion.chunk" for ch in chunks if ch != "[DONE]")
    report("chat stream: role first, content = non-streamed", ok,
           "first delta %s, %d chunks" % (first, len(chunks)) if ok
           else "first %s, %r vs %r, %s" % (first, text, want, s.problems[:2]))
    # Sampled text with high temperature: many byte tokens that are not whole characters. Each
    # chunk must still be whole UTF-8 (the stream never splits a character), and a seeded
    # request streams the same text as its non-streamed twin.
    body = {"prompt": "Copyright ©", "max_tokens": 300, "temperature": 3, "seed": 7,
            "ignore_eos": True}
    want, _, _ = complete(port, body)
    s = Stream(port, body)
    chunks, text, finish = s.read_all()
    non_ascii = sum(1 for ch in text if ord(ch) > 127)
    ok = not s.problems and s.done and text == want
    report("sampled bytes streamed: strict UTF-8, same text", ok,
           "%d chunks, %d non-ASCII characters" % (len(chunks), non_ascii) if ok
           else "%s; same text %s" % (s.problems[:2], text == want))


# ---------------------------------------------------------------- 3. stop strings


def stop_case(port, name, prompt, stops, want, want_finish):
    text, c, _ = complete(port, greedy(prompt, stop=stops))
    ok = text == want and c["finish_reason"] == want_finish
    report(name, ok, "%r, %s" % (short(text, 60), c["finish_reason"]) if ok
           else "got %r (%s), want %r (%s)" % (text, c["finish_reason"], want, want_finish))
    s = Stream(port, greedy(prompt, stop=stops))
    _, stext, sfinish = s.read_all()
    ok = stext == want and sfinish == want_finish and s.done and not s.problems
    report(name + ", streamed", ok, "" if ok else "got %r (%s), want %r (%s) %s"
           % (stext, sfinish, want, want_finish, s.problems[:2]))


def cmd_stop(args):
    port = args.port
    prompt = GEN_PROMPTS[0]
    T, c, _ = complete(port, greedy(prompt))
    if c["finish_reason"] != "length" or len(T) < 40:
        report("stop: a long enough greedy text", False, "%r %s" % (T, c["finish_reason"]))
        return
    # S starts in the middle of T (within a token, most likely); its first occurrence cuts.
    mid = len(T) // 2 + 1
    S = T[mid:mid + 5]
    stop_case(port, "stop [S] = T before S", prompt, [S], T[:T.find(S)], "stop")
    early = T[len(T) // 4:len(T) // 4 + 3]
    cut = min(T.find(S), T.find(early))
    stop_case(port, "several stops: the earliest wins", prompt, [S, early], T[:cut], "stop")
    stop_case(port, "a stop that never occurs", prompt, ["\x01never\x02", "zzqzz"], T, "length")
    # A stop at the very start: nothing is returned.
    stop_case(port, "a stop that is T's start", prompt, [T[:3]], "", "stop")


# ---------------------------------------------------------------- 4. errors


def cmd_errors(args):
    port = args.port
    P = "/v1/completions"
    post = lambda body, **kw: request(port, "POST", P, body, **kw)
    expect_error("400 malformed JSON", post(b'{"prompt": "hi", "max_tokens": '), 400)
    expect_error("400 max_tokens \"x\"", post({"prompt": "hi", "max_tokens": "x"}), 400,
                 "max_tokens")
    expect_error("400 max_tokens 0", post({"prompt": "hi", "max_tokens": 0}), 400, "max_tokens")
    expect_error("400 max_tokens 0, stream: true",
                 post({"prompt": "hi", "max_tokens": 0, "stream": True}), 400, "max_tokens")
    expect_error("400 temperature -1", post({"prompt": "hi", "temperature": -1}), 400,
                 "temperature")
    expect_error("400 top_p 0", post({"prompt": "hi", "top_p": 0}), 400, "top_p")
    expect_error("400 top_p 1.5", post({"prompt": "hi", "top_p": 1.5}), 400, "top_p")
    expect_error("400 n 2", post({"prompt": "hi", "n": 2}), 400, "n")
    expect_error("400 stop: 5 strings", post({"prompt": "hi", "stop": list("abcde")}), 400,
                 "stop")
    expect_error("400 no prompt", post({"max_tokens": 3}), 400, "prompt")
    expect_error("400 token id outside the vocabulary", post({"prompt": [1, 99999]}), 400)
    expect_error("400 prompt of 5000 ids (context 4096)",
                 post({"prompt": [100] * 5000, "max_tokens": 4}), 400, "prompt")
    expect_error("400 prompt + max_tokens over the context",
                 post({"prompt": "hi", "max_tokens": 5000}), 400, "max_tokens")
    expect_error("400 invalid UTF-8 in the body",
                 post(b'{"prompt": "ab\xff\xfe cd", "max_tokens": 3}'), 400)
    expect_error("400 chat: unknown role", request(port, "POST", "/v1/chat/completions", {
        "messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role")
    expect_error("404 unknown model", post({"model": "gpt-4", "prompt": "hi"}), 404, "model",
                 type_="not_found_error")
    expect_error("404 unknown path", request(port, "GET", "/v1/nothing"), 404)
    big = b'{"prompt": "' + b"a" * (5 << 20) + b'", "max_tokens": 1}'
    expect_error("413 body of 5 MiB", post(big), 413)
    # Bad input did not disturb the server: it still answers as before.
    text, _, _ = complete(port, greedy(GEN_PROMPTS[0]))
    text2, _, _ = complete(port, greedy(GEN_PROMPTS[0]))
    report("after the errors: still serving, same answer", text == text2, short(text, 60))


def cmd_auth(args):
    port, key, name = args.port, args.key, args.name
    ok_h = {"Authorization": "Bearer " + key}
    body = {"model": name, "prompt": GEN_PROMPTS[0], "max_tokens": 4, "temperature": 0}
    expect_error("401 without a key", request(port, "POST", "/v1/completions", body), 401)
    expect_error("401 with a wrong key", request(port, "POST", "/v1/completions", body,
                                                 {"Authorization": "Bearer not-" + key}), 401)
    expect_error("401 /v1/models without a key", request(port, "GET", "/v1/models"), 401)
    r = request(port, "POST", "/v1/completions", body, ok_h)
    report("200 with the key, model %r" % name, r.status == 200 and r.json()["model"] == name,
           "HTTP %d" % r.status)
    r = request(port, "GET", "/v1/models", headers=ok_h)
    ids = [m.get("id") for m in r.json().get("data", [])] if r.status == 200 else None
    report("/v1/models lists the served name", ids == [name], "HTTP %d %s" % (r.status, ids))
    expect_error("404 model 'tiny' when served as %r" % name, request(
        port, "POST", "/v1/completions", dict(body, model="tiny"), ok_h), 404, "model")
    r = request(port, "GET", "/health")
    report("/health needs no key", r.status == 200, "HTTP %d" % r.status)


# ---------------------------------------------------------------- 4b. 429 and "never fits"


def cmd_busy(args):
    port = args.port
    n = 6
    barrier = threading.Barrier(n)
    results = [None] * n

    def one(i):
        barrier.wait()
        body = {"prompt": PROMPTS16[i], "max_tokens": 300, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        try:
            s = Stream(port, body)
            if s.status != 200:
                results[i] = (s.status, {k.lower(): v for k, v in s.resp.getheaders()},
                              s.resp.read(), None)
                s.close()
                return
            chunks, text, finish = s.read_all()
            usage = chunks[-2].get("usage") if len(chunks) >= 2 else None
            results[i] = (200, {}, None, (finish, usage, s.done, s.problems))
        except Exception as e:  # noqa: BLE001 (reported below)
            results[i] = (0, {}, repr(e).encode(), None)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got429 = [r for r in results if r and r[0] == 429]
    got200 = [r for r in results if r and r[0] == 200]
    others = [(r[0], short(r[2])) for r in results if not r or r[0] not in (200, 429)]
    ok429 = bool(got429) and all(
        r[1].get("retry-after", "").isdigit() and not error_shape(Reply(*r[:3])) and
        json.loads(r[2])["error"]["code"] == "queue_full" for r in got429)
    report("429 with Retry-After when the queue is full", ok429 and not others,
           "%d x 429, %d x 200%s" % (len(got429), len(got200), " others %s" % others if others
                                      else ""))
    ok200 = bool(got200) and all(
        r[3][0] == "length" and r[3][1] and r[3][1]["completion_tokens"] == 300 and r[3][2] and
        not r[3][3] for r in got200)
    report("the admitted ones complete (300 tokens each)", ok200,
           "%d streams" % len(got200) if ok200 else "; ".join(str(r[3][:2]) for r in got200))
    # --kv-pages pages of 64 tokens per rank: more than that can never be admitted.
    too_many = args.kv_pages * 64 + 1
    expect_error("400 never fits: max_tokens over --kv-pages",
                 request(port, "POST", "/v1/completions",
                         {"prompt": "hi", "max_tokens": too_many}), 400, "max_tokens",
                 message_re="KV cache")
    text, c, _ = complete(port, greedy(GEN_PROMPTS[0], max_tokens=8))
    report("then a request that fits is served", c["finish_reason"] in ("length", "stop"),
           short(text, 60))


# ---------------------------------------------------------------- 5 + 9. batch invariance


def cmd_concurrent(args):
    port = args.port
    solo = []
    for p in PROMPTS16:
        text, c, _ = complete(port, greedy(p, max_tokens=32))
        solo.append(text)
    got = [None] * len(PROMPTS16)
    barrier = threading.Barrier(len(PROMPTS16))

    def one(i):
        barrier.wait()
        try:
            got[i] = complete(port, greedy(PROMPTS16[i], max_tokens=32))[0]
        except Exception as e:  # noqa: BLE001 (a mismatch below)
            got[i] = repr(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS16))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad = [i for i in range(len(PROMPTS16)) if got[i] != solo[i]]
    report("16 concurrent greedy = each alone" + (" (%s)" % args.where if args.where else ""),
           not bad, "%d prompts, %d distinct answers" % (len(solo), len(set(solo))) if not bad
           else "differ at %s: %r vs %r" % (bad, got[bad[0]], solo[bad[0]]))
    if args.save:
        with open(args.save, "w") as f:
            json.dump(solo, f)
    if args.compare:
        with open(args.compare) as f:
            ref = json.load(f)
        bad = [i for i in range(len(ref)) if ref[i] != solo[i] or ref[i] != got[i]]
        report("16 greedy answers: %s" % args.label, not bad,
               "" if not bad else "differ at %s: %r vs %r" % (bad, solo[bad[0]], ref[bad[0]]))


# ---------------------------------------------------------------- 6. disconnect


def cmd_disconnect(args):
    port = args.port
    other_prompt = PROMPTS16[1]
    other_want, _, _ = complete(port, greedy(other_prompt, max_tokens=200, ignore_eos=True))
    before = metrics(port)
    # A raw socket: read two SSE chunks of a long request, then close.
    body = json.dumps({"prompt": PROMPTS16[0], "max_tokens": 2000, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""
    while buf.count(b"data: ") < 2:
        d = sock.recv(4096)
        if not d:
            break
        buf += d
    # A concurrent request, started before the close and still running after it.
    other = {}

    def run_other():
        try:
            other["text"], other["choice"], other["json"] = complete(
                port, greedy(other_prompt, max_tokens=200, ignore_eos=True))
        except Exception as e:  # noqa: BLE001 (reported below)
            other["error"] = repr(e)

    t = threading.Thread(target=run_other)
    t.start()
    time.sleep(0.05)
    sock.close()
    closed = time.monotonic()
    freed_after = None
    m = None
    while time.monotonic() - closed < 5:
        m = metrics(port)
        if m["deepinfer_kv_pages_used"] == 0 and m["deepinfer_requests_running"] == 0 and \
                not t.is_alive():
            freed_after = time.monotonic() - closed
            break
        time.sleep(0.05)
    t.join()
    report("disconnect: pages and running back to 0", freed_after is not None,
           "after %.2f s" % freed_after if freed_after is not None else
           "after 5 s: pages used %s, running %s" % (m and m["deepinfer_kv_pages_used"],
                                                     m and m["deepinfer_requests_running"]))
    # What the closed request generated: the counter's growth less the other request's tokens.
    after = metrics(port)
    grew = after["deepinfer_generation_tokens_total"] - before["deepinfer_generation_tokens_total"]
    mine = grew - (200 if "text" in other else 0)
    report("disconnect: that request was cancelled", mine < 1000,
           "it generated %d of its 2000 tokens" % mine)
    ok = other.get("text") == other_want
    report("disconnect: a concurrent request completes the same", ok,
           short(other.get("text", other.get("error", "")), 60) if ok else
           "got %r, want %r" % (other.get("text", other.get("error")), other_want))


# ---------------------------------------------------------------- 7. health


def cmd_health(args):
    """Polls /health from before the server listens until it is 200."""
    port = args.port
    seen = []  # statuses in order, consecutive duplicates dropped
    during_503 = None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            r = request(port, "GET", "/health", timeout=5)
        except OSError:
            time.sleep(0.002)
            continue
        if not seen or seen[-1] != r.status:
            seen.append(r.status)
        if r.status == 503 and during_503 is None:
            c = request(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                        {"Authorization": "Bearer " + args.key} if args.key else None, timeout=5)
            during_503 = (c.status, error_shape(c), r.json())
        if r.status == 200:
            break
        time.sleep(0.002)
    report("/health 200 once loaded", seen[-1:] == [200] and seen.count(200) == 1,
           "statuses seen: %s" % seen)
    if 503 in seen and 200 in seen:
        # A completion while /health was 503 was refused (503, or 200 if the model became
        # ready in between).
        ok = seen.index(503) < seen.index(200) and during_503[2].get("status") == "loading" and \
            (during_503[0] == 200 or (during_503[0] == 503 and not during_503[1]))
        report("/health 503 while loading", ok, "completion then: HTTP %d" % during_503[0])
    else:
        skip("/health 503 while loading", "the model loaded before the first poll")


# ---------------------------------------------------------------- 8. SIGTERM


def cmd_sigterm(args):
    port = args.port
    s = Stream(port, {"prompt": PROMPTS16[2], "max_tokens": 3000, "temperature": 0,
                      "ignore_eos": True, "stream_options": {"include_usage": True}})
    it = s.events()
    first = [next(it, None), next(it, None)]
    os.kill(args.pid, signal.SIGTERM)
    time.sleep(0.3)
    # Draining: no new request is admitted while the running one finishes.
    try:
        r = request(port, "POST", "/v1/completions", greedy("hi"), timeout=10)
        refused = "HTTP %d" % r.status
        ok_refused = r.status == 503 and not error_shape(r)
    except OSError as e:
        refused, ok_refused = repr(e), True  # no longer listening: refused as well
    report("SIGTERM: a new request is refused (503)", ok_refused, refused)
    chunks = [c for c in first if c is not None]
    for ev in it:
        chunks.append(ev)
    s.close()
    finish = None
    for ev in chunks:
        if ev != "[DONE]":
            for c in ev.get("choices", []):
                finish = c.get("finish_reason") or finish
    usage = chunks[-2].get("usage") if len(chunks) >= 2 and chunks[-1] == "[DONE]" else None
    ok = s.done and finish == "length" and usage and usage["completion_tokens"] == 3000 and \
        not s.problems
    report("SIGTERM: the running stream completes", bool(ok),
           "finish %s, usage %s, [DONE] %s %s" % (finish, usage, s.done, s.problems[:2]))


# ---------------------------------------------------------------- 8. a failed host (multihost)


def cmd_failover(args):
    """A streaming and a non-streamed request run when `--then` fails another host of the launch
    (scripts/stages/multihost.sh): both must end with an error answer, the stream with an SSE
    error event and no [DONE], the other with HTTP 5xx and an error body; never a cut stream or
    a closed connection."""
    port = args.port
    body = greedy(PROMPTS16[3], max_tokens=3000, ignore_eos=True)
    plain = {}

    def run_plain():
        try:
            plain["reply"] = request(port, "POST", "/v1/completions", body, timeout=args.timeout)
        except Exception as e:  # noqa: BLE001 (a transport error is what this check catches)
            plain["error"] = e
        plain["at"] = time.time()

    t = threading.Thread(target=run_plain)
    t.start()
    s = Stream(port, body)
    s.conn.sock.settimeout(args.timeout)
    it = s.events()
    chunks = [next(it, None) for _ in range(3)]
    # Both run before the host fails: the non-streamed one is in /metrics' running count.
    deadline = time.time() + 30
    while metrics(port).get("deepinfer_requests_running", 0) < 2 and time.time() < deadline:
        time.sleep(0.1)
    running = metrics(port).get("deepinfer_requests_running", 0)
    report("failover: both requests run before the failure", running >= 2 and None not in chunks,
           "%d running, %d chunks streamed" % (running, len([c for c in chunks if c])))
    t0 = time.time()
    subprocess.run(args.then, shell=True, check=True)
    cut = ""
    try:
        for ev in it:
            chunks.append(ev)
    except Exception as e:  # noqa: BLE001 (a cut chunked stream raises here)
        cut = repr(e)[:120]
    stream_end = time.time() - t0
    s.close()
    t.join()
    last = chunks[-1] if chunks else None
    err = last.get("error") if isinstance(last, dict) else None
    ok = not cut and not s.done and isinstance(err, dict) and bool(err.get("message")) and \
        not s.problems
    report("failover: the stream ends with an error event", ok,
           "after %.1f s: %s" % (stream_end, short(err.get("message"), 140)) if ok else
           "cut %s, [DONE] %s, last event %s %s" % (cut or "no", s.done, short(last, 120),
                                                    s.problems[:2]))
    r = plain.get("reply")
    if r is None:
        report("failover: the non-streamed request gets HTTP 5xx", False,
               "no answer: %r" % plain.get("error"))
        return
    why = "" if r.status >= 500 else "HTTP %d" % r.status
    why = why or error_shape(r)
    report("failover: the non-streamed request gets HTTP 5xx", not why,
           why or "HTTP %d after %.1f s: %s" % (r.status, plain["at"] - t0,
                                                short(r.json()["error"]["message"], 120)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--deepinfer")
    ap.add_argument("--model")
    ap.add_argument("--key", default="")
    ap.add_argument("--name")
    ap.add_argument("--kv-pages", type=int)
    ap.add_argument("--save")
    ap.add_argument("--compare")
    ap.add_argument("--label", default="")
    ap.add_argument("--where", default="")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--then")
    args = ap.parse_args()
    global MODEL_NAME, HOST
    HOST = args.host
    if args.name:
        MODEL_NAME = args.name
    if args.key:
        AUTH["Authorization"] = "Bearer " + args.key
    fn = globals().get("cmd_" + args.what)
    if fn is None:
        sys.exit("serve_client.py: unknown check group %r" % args.what)
    try:
        fn(args)
    except Exception as e:  # noqa: BLE001 (any failure is a FAIL line, never a silent pass)
        report("%s: ran to the end" % args.what, False, repr(e)[:300])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
