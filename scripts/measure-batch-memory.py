#!/usr/bin/env python3
"""Peak RSS growth of `cairn serve` under 8 concurrent batch requests (issue 13, item 1).

Two scenarios, each on a fresh server (lexical only, CAIRN_WORKERS=0, so no model is loaded):
  over   8 x a 60 MiB body `{"items":[0,0,...]}` (about 31 million items; the limit is 1000)
  at     8 x a batch at the limits: 1000 items of distinct text, about 60 MiB per body

Peak RSS is the kernel's high-water mark (VmHWM); growth is measured from the RSS after a warm
up request. Writes JSON to --out and prints it.

  python3 scripts/measure-batch-memory.py --binary target/debug/cairn --out batch-memory.json
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import tempfile
import time

MIB = 1024 * 1024


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def start(binary, data_dir):
    env = dict(os.environ, CAIRN_WORKERS="0", CAIRN_LOG="warn")
    process = subprocess.Popen(
        [binary, "serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    for line in process.stdout:
        match = re.match(r"listening on http://([0-9.]+):(\d+)", line)
        if match:
            return process, match.group(1), int(match.group(2))
    raise RuntimeError("cairn serve did not start")


def post(host, port, token, body):
    connection = http.client.HTTPConnection(host, port, timeout=600)
    connection.request("POST", "/v1/sources/batch", body=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    code = None
    try:
        code = json.loads(answer).get("code")
    except ValueError:
        pass
    return response.status, code


def scenario(binary, name, bodies):
    with tempfile.TemporaryDirectory() as data_dir:
        process, host, port = start(binary, data_dir)
        try:
            with open(os.path.join(data_dir, "admin.token")) as handle:
                token = handle.read().strip()
            post(host, port, token, json.dumps({"items": [
                {"dataset": "warm", "source_key": "w", "content": "warm up"}]}).encode())
            baseline = status_kib(process.pid, "VmRSS")
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
                answers = list(pool.map(lambda body: post(host, port, token, body), bodies))
            elapsed = time.monotonic() - started
            peak = status_kib(process.pid, "VmHWM")
        finally:
            process.terminate()
            process.wait(timeout=60)
    return {
        "scenario": name,
        "requests": len(bodies),
        "body_mib": round(len(bodies[0]) / MIB, 1),
        "answers": sorted({f"{status} {code}" for status, code in answers}),
        "baseline_rss_mib": round(baseline / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_growth_mib": round((peak - baseline) / 1024, 1),
        "seconds": round(elapsed, 2),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/debug/cairn")
    parser.add_argument("--out", default="batch-memory.json")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    over = b'{"items":[' + b"0," * (30 * MIB) + b"0]}"
    at = []
    for request in range(args.concurrency):
        filler = "lorem ipsum dolor sit amet " * 2300
        items = [{"dataset": "docs", "source_key": f"r{request}/i{index}",
                  "content": f"request {request} item {index} {filler}"}
                 for index in range(1000)]
        at.append(json.dumps({"items": items}).encode())
    report = {
        "binary": args.binary,
        "scenarios": [
            scenario(args.binary, "over_item_limit", [over] * args.concurrency),
            scenario(args.binary, "at_limits", at),
        ],
    }
    text = json.dumps(report, indent=2)
    with open(args.out, "w") as handle:
        handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
