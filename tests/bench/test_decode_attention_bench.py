"""benchmarks/decode_attention_bench.py's rows: every slot, or a server's rows from MIN to MAX slots;
a malformed --used exits 2 before anything else (the GPU check comes after)."""

from __future__ import annotations

from tests.benchmark_scripts import load_script


def test_rows_use_all_slots_or_an_even_spread():
    bench = load_script("decode_attention_bench")
    assert bench.rows_used(None, 3, 1024) == [1024, 1024, 1024]
    assert bench.rows_used("512,640", 5, 1024) == [512, 544, 576, 608, 640]
    assert bench.rows_used("600,700", 1, 1024) == [600]
    for bad in ("5", "5,3", "0,4", "3,2000", "a,b", "1,2,3"):
        assert bench.rows_used(bad, 4, 1024) is None, bad


def test_a_bad_used_exits_2_naming_it(capsys):
    bench = load_script("decode_attention_bench")
    assert bench.main(["--out", "unused", "--used", "7", "--slots", "64"]) == 2
    err = capsys.readouterr().err
    assert "--used 7" in err and "--slots (64)" in err and len(err.strip().splitlines()) == 1
