"""Per kernel name, the median of how far each call moved the end of the GPU's timeline past every
kernel before it ("end advance"), its duration, and how long before that point it started (a
kernel launched early by programmatic dependent launch starts before its predecessor ends), over a
torch.profiler trace that `kiln bench llm --profile-decode` wrote.

    python ends.py profile/int4_triton_b16_trace.json.gz
"""

import gzip
import json
import statistics
import sys
from collections import defaultdict


def main(path: str) -> None:
    trace = json.load(gzip.open(path))
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    advance, duration, early = defaultdict(list), defaultdict(list), defaultdict(list)
    timeline_end = None
    for e in kernels:
        name, end = e["name"][:30], e["ts"] + e["dur"]
        if timeline_end is not None:
            advance[name].append(end - timeline_end)
            early[name].append(timeline_end - e["ts"])
        duration[name].append(e["dur"])
        timeline_end = end if timeline_end is None else max(timeline_end, end)
    for name, values in advance.items():
        if len(values) > 50:
            print(f"{name:32s} calls {len(values):5d}  end advance {statistics.median(values):6.2f} us  "
                  f"duration {statistics.median(duration[name]):6.2f} us  "
                  f"started before the timeline's end {statistics.median(early[name]):6.2f} us")


if __name__ == "__main__":
    main(sys.argv[1])
