"""A steady CPU-bound process to run beside a benchmark: the "busy machine" of issue 16.

A real background job (a second `eagle3-hf regenerate`, say) loads the CPU in bursts: prefill, decoding, writing,
each at another intensity, so the timings of a benchmark run beside it scatter with the job's phases rather than with
what is measured (session 15: per-prompt ratios of 0.54-2.31 for the same method). This process loads the cores
evenly instead: float32 matrix products of one size on `--threads` torch threads, back to back, until it is stopped
(SIGTERM, SIGINT) or `--seconds` have passed. At the end it prints how much work it did, which tells what share of
the machine it got.

    .venv/bin/python scripts/cpu_load.py --threads 2 & LOAD=$!
    .venv/bin/eagle3-hf bench --datasets mt_bench --limit 16 --methods plain adaptive --threads 2
    kill $LOAD
"""

import argparse
import signal
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the load (default: 2)")
    parser.add_argument("--size", type=int, default=384, help="side of the square float32 matrices multiplied")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: when killed)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    stopped = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.append(True))
    left, right = torch.randn(args.size, args.size), torch.randn(args.size, args.size)
    product = torch.empty(args.size, args.size)
    begin = time.monotonic()
    end = None if args.seconds is None else begin + args.seconds
    products = 0
    while not stopped and (end is None or time.monotonic() < end):
        torch.mm(left, right, out=product)
        products += 1
    seconds = time.monotonic() - begin
    gflops = 2 * args.size**3 * products / seconds / 1e9
    print(
        f"cpu_load: {products} products of {args.size}x{args.size} in {seconds:.0f} s on {args.threads} threads, "
        f"{gflops:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
