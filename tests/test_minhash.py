import json
import random

import datasketch
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from curation.dedup import run_dedup
from curation.minhash import (
    DedupAlarm,
    components,
    cross_dedup,
    jaccard,
    minhash,
    near_dedup,
    shingles,
    verify,
)
from curation.params import AlarmParams, DedupParams, MinHashConfig, NearParams
from tests.rows import rl_table, sft_table

WORDS = [f"w{i}" for i in range(5000)]
NO_ALARM = AlarmParams(max_cluster_size=1000, max_source_loss=1.0, on_alarm="fail")


def _text(seed, n=80):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _edit(text, k, seed):
    """Replace ``k`` words at distinct positions of ``text`` by fresh words of the same length."""
    words = text.split()
    for i, pos in enumerate(random.Random(seed).sample(range(len(words)), k)):
        words[pos] = ("z" + f"{seed:03d}{i:03d}")[: len(words[pos])]
    return " ".join(words)


def _run(texts, cfg=None, alarms=NO_ALARM, sources=None, groups=None):
    cfg = cfg or MinHashConfig()
    frame = pl.DataFrame({"uuid": [f"u{i:02d}" for i in range(len(texts))], "text": texts})
    meta = frame.select("uuid", pl.Series("source", sources or ["s"] * len(texts)),
                        pl.Series("group", groups or ["g"] * len(texts)),
                        pl.Series("priority", [0] * len(texts)))
    batches = lambda: (frame.slice(i, cfg.batch_rows) for i in range(0, len(frame), cfg.batch_rows))
    return near_dedup(batches, meta, cfg, alarms)


def _j(a, b, n=5):
    cfg = MinHashConfig(ngram=n)
    h, off = shingles(pl.Series([a, b]), cfg)
    return jaccard(np.unique(h[off[0]:off[1]]), np.unique(h[off[1]:off[2]]))


def test_signatures_equal_datasketch_bit_for_bit():
    cfg = MinHashConfig()
    h, off = shingles(pl.Series([_text(1), "too short", _text(2, 30)]), cfg)
    sig = minhash(h, off, cfg)
    for d in range(3):
        m = datasketch.MinHash(num_perm=128, seed=1, scheme="affine32", hashfunc=lambda x: x)
        m.update_batch([int(v) for v in h[off[d]:off[d + 1]] >> np.uint64(32)])
        assert np.array_equal(m.hashvalues, sig[d])
    assert (sig[1] == np.iinfo(np.uint32).max).all()  # no shingle: empty signature


def test_bands_rows_come_from_threshold_and_are_recorded():
    assert MinHashConfig().bands_rows == (16, 8)
    assert MinHashConfig(false_negative_weight=0.5).bands_rows == (9, 13)  # datasketch's default weights
    s = MinHashConfig().settings()
    assert {k: s[k] for k in ("num_perm", "bands", "rows", "seed", "scheme")} == {
        "num_perm": 128, "bands": 16, "rows": 8, "seed": 1, "scheme": "affine32"}
    assert s["datasketch_version"] == datasketch.__version__ and MinHashConfig().tag() == "5w_128p_16b8r_s1"


def test_band_keys_spilled_to_files_equal_held_ones_and_rows_out_of_meta_order_are_refused(tmp_path):
    from curation.minhash import band_keys, compute_signatures

    cfg = MinHashConfig(batch_rows=3)
    texts = [_text(i, 40) for i in range(7)] + ["too short", "Too  short"]
    frame = pl.DataFrame({"uuid": [f"u{i}" for i in range(len(texts))], "text": texts})
    batches = lambda: (frame.slice(i, 3) for i in range(0, len(frame), 3))
    held, short, lengths = compute_signatures(batches, cfg, frame["uuid"])
    spilled, short2, none = compute_signatures(batches, cfg, frame["uuid"], spill=tmp_path / "texts.parquet")
    h, off = shingles(frame["text"], cfg)
    want = band_keys(minhash(h, off, cfg), 16, 8)
    assert none is None and spilled.values is None and len(spilled) == len(texts)
    on_disk = pl.read_parquet(tmp_path / "texts.parquet")
    assert on_disk.columns == ["uuid", "has", "length"] + [f"k{b}" for b in range(16)]
    assert on_disk["uuid"].equals(frame["uuid"]) and on_disk["length"].to_list() == [len(t) for t in texts]
    for b in range(16):
        assert np.array_equal(held.band(b), want[:, b]) and np.array_equal(spilled.band(b), want[:, b])
    assert held.has.tolist() == spilled.has.tolist() == [True] * 7 + [False, False]
    assert short.equals(short2) and short["i"].to_list() == [7, 8] and short["k"].n_unique() == 1
    assert lengths.tolist() == [len(t) for t in texts]
    with pytest.raises(ValueError, match="rows: batches and meta list different rows"):
        compute_signatures(batches, cfg, frame["uuid"].reverse())
    with pytest.raises(ValueError, match="batches and meta list different rows"):
        compute_signatures(batches, cfg, frame["uuid"].append(pl.Series(["extra"])))


def test_removed_rows_and_survivors_are_identical_across_reruns_batches_and_workers():
    texts = []
    for base in range(6):
        t = _text(base)
        texts += [t, _edit(t, 1, base), _edit(t, 1, base + 100), _text(base + 1000)]
    runs = [_run(texts, MinHashConfig(workers=w, batch_rows=b))[0] for w, b in ((1, 1000), (2, 3), (2, 5), (1, 7))]
    assert all(r.equals(runs[0]) for r in runs[1:])
    assert len(runs[0]) == 12  # each base keeps 1 of its 3 near-copies (J 0.88 to the base); the others stay
    assert set(runs[0]["reason"].str.extract(r"of (u\d+)").to_list()) == {f"u{4 * b:02d}" for b in range(6)}


def test_candidate_chain_merges_only_through_verified_edges():
    a = np.arange(0, 100, dtype=np.uint64)
    b = np.arange(10, 110, dtype=np.uint64)  # J(a, b) = 90/110 = 0.82
    c = np.arange(20, 120, dtype=np.uint64)  # J(b, c) = 0.82, J(a, c) = 80/120 = 0.67
    c_far = np.arange(40, 140, dtype=np.uint64)  # J(b, c_far) = 70/130 = 0.54
    pairs = np.array([[0, 1], [1, 2], [0, 2]])
    both = verify(pairs, ["a", "b", "c"], {"a": a, "b": b, "c": c}, 0.8)
    assert both["edge"].to_list() == [True, True, False]
    edges = both.filter("edge").select("i", "j").to_numpy()
    assert components(3, edges).tolist() == [0, 0, 0]  # a and c merge through two verified edges
    one = verify(pairs, ["a", "b", "c"], {"a": a, "b": b, "c": c_far}, 0.8)
    assert one["edge"].to_list() == [True, False, False]
    assert components(3, one.filter("edge").select("i", "j").to_numpy()).tolist() == [0, 0, 1]


def test_near_duplicates_at_known_jaccard_and_reason_names_survivor():
    base = _text(7)
    near, far = _edit(base, 1, 1), _edit(base, 6, 2)
    assert round(_j(base, near), 3) == round(71 / 81, 3)  # one word changes 5 shingles: 71 shared of 81
    assert _j(base, far) < 0.8
    removed, stats = _run([base, near, far])
    assert removed["uuid"].to_list() == ["u01"]  # equal priority and length: smaller uuid survives
    assert removed["reason"].to_list() == [f"near_duplicate: of u00 J={round(71 / 81, 2)}"]
    assert stats["clusters"] == 2 and stats["removed"] == 3 - 2


def test_survivor_is_first_by_priority_then_length_then_uuid():
    base = _text(3)
    longer = base + " extra"
    frame_texts = [base, longer, _edit(base, 1, 9)]
    cfg = MinHashConfig()
    frame = pl.DataFrame({"uuid": ["a", "b", "c"], "text": frame_texts})
    meta = pl.DataFrame({"uuid": ["a", "b", "c"], "source": "s", "group": "g", "priority": [1, 1, 0]})
    removed, _ = near_dedup(lambda: [frame], meta, cfg, NO_ALARM)
    assert sorted(removed["uuid"]) == ["a", "b"] and set(removed["reason"].str.slice(0, 22)) == {"near_duplicate: of c J"}
    meta = meta.with_columns(pl.Series("priority", [0, 0, 0]))
    removed, _ = near_dedup(lambda: [frame], meta, cfg, NO_ALARM)
    assert sorted(removed["uuid"]) == ["a", "c"]  # the longest survives


def test_texts_shorter_than_the_shingle_fall_back_to_exact_normalized_match():
    removed, stats = _run(["Hi there!", "hi   THERE!", "hi there?", "Hello"])
    assert removed["reason"].to_list() == ["near_duplicate: of u01 J=1.0"]  # case/space equal; longer survives
    assert removed["uuid"].to_list() == ["u00"] and stats["short_text_edges"] == 1


def test_unicode_cjk_cyrillic_and_table_rows_stay_distinct():
    cjk = "小明有三个苹果他又买了五个苹果现在他一共有多少个苹果呢请你仔细算一算"
    cyr = "Сколько будет два плюс два если считать очень внимательно и медленно сегодня"
    table = "| name | score |\n|---|---|\n| alice | 91 |\n| bob | 78 |\n| carol | 85 |"
    texts = [cjk, cjk.replace("苹果", "梨子"), cyr, cyr.replace("два", "три"), table, table.replace("91", "19"),
             cjk + "。", cyr.upper()]
    removed, _ = _run(texts)
    # only the re-punctuated CJK copy (longer: it survives) and the upper-cased Cyrillic copy are duplicates
    assert removed["uuid"].to_list() == ["u00", "u07"]
    assert removed["reason"].to_list() == ["near_duplicate: of u06 J=1.0", "near_duplicate: of u02 J=1.0"]
    assert _j(table, table.replace("91", "19")) < 0.8


def test_scope_groups_are_never_compared():
    t = _text(5)
    removed, _ = _run([t, _edit(t, 1, 1)], groups=["math", "code"])
    assert removed.is_empty()


def test_alarm_fails_with_the_cluster_shown_or_warns():
    t = _text(11)
    texts = [t] + [_edit(t, 1, s) for s in range(1, 5)] + [_text(12)]
    alarms = AlarmParams(max_cluster_size=3, max_source_loss=1.0, on_alarm="fail")
    with pytest.raises(DedupAlarm, match=r"cluster of 5 rows > max_cluster_size 3 \(survivor u00\)") as err:
        _run(texts, alarms=alarms)
    assert "u03: 'w" in str(err.value)  # members are listed with their text
    removed, stats = _run(texts, alarms=alarms.model_copy(update={"on_alarm": "warn"}))
    assert len(removed) == 4 and len(stats["alarms"]) == 1
    loss = AlarmParams(max_cluster_size=100, max_source_loss=0.5, on_alarm="fail")
    with pytest.raises(DedupAlarm, match="source a loses 4/5 rows"):
        _run(texts, alarms=loss, sources=["a"] * 5 + ["b"])


def test_rl_prompts_vs_sft_prompts_removes_only_rl_rows(tmp_path):
    q, other = _text(21), _text(22)
    sft = pl.DataFrame({"uuid": ["s0", "s1", "s2"], "text": [q, other, "short one"], "source": "sft"})
    rl = pl.DataFrame({"uuid": ["r0", "r1", "r2"], "text": [_edit(q, 1, 3), _text(23), "Short  ONE"], "source": "rl"})
    removed, stats = cross_dedup(lambda: [sft], sft, lambda: [rl], rl, MinHashConfig(), "rl vs sft")
    sft.write_parquet(tmp_path / "sft.parquet")
    rl.select("uuid", "source").write_parquet(tmp_path / "rl.parquet")
    again = cross_dedup(lambda: [sft], tmp_path / "sft.parquet", lambda: [rl], tmp_path / "rl.parquet",
                        MinHashConfig(), "rl vs sft")
    assert removed.equals(again[0]) and stats == again[1] and stats["rows"] == 6 and stats["candidate_pairs"] == 1
    assert removed["uuid"].to_list() == ["r0", "r2"]
    assert removed["reason"].to_list() == [f"near_duplicate: of s0 J={round(71 / 81, 2)} (rl vs sft)",
                                           "near_duplicate: of s2 J=1.0 (rl vs sft)"]


def test_run_dedup_streams_files_and_counts_balance(tmp_path):
    t = _text(31)
    sft = sft_table([t, _edit(t, 1, 1), t.upper(), _text(32)], domain=["chat"] * 4)
    rl = rl_table([_text(33), _edit(_text(33), 1, 2)], source="train")
    src = tmp_path / "in"
    src.mkdir()
    sft.write_parquet(src / "sft.parquet", row_group_size=2)
    rl.write_parquet(src / "rl.parquet")
    params = DedupParams(normalize=True, near=NearParams(batch_rows=3, scope="within_domain", rl_vs_sft=True,
                                                         alarms=NO_ALARM))
    m = run_dedup(params, {"train_src": 0, "train": 1}, src, tmp_path / "out", tmp_path / "sig", root=tmp_path)
    assert (m["rows_in"], m["rows_out"], m["rejected_by_reason"]) == (6, 3, {"exact_duplicate": 1, "near_duplicate": 2})
    assert pq.read_table(tmp_path / "out" / "sft.parquet")["uuid"].to_pylist() == ["s0", "s3"]
    rejects = pq.read_table(tmp_path / "rejects" / "dedup.parquet", columns=["record_id", "reason"]).to_pydict()
    reasons = dict(zip(*rejects.values()))
    assert reasons == {"s2": "exact_duplicate: of s0", "s1": f"near_duplicate: of s0 J={round(71 / 81, 2)}",
                       "b1": f"near_duplicate: of b0 J={round(71 / 81, 2)}"}
    meta = pq.read_schema(tmp_path / "sig" / "sft.parquet").metadata
    assert json.loads(meta[b"minhash"])["bands"] == 16


def test_exempt_sources_get_exact_dedup_only(tmp_path):
    t = _text(41)
    rl = rl_table([t, _edit(t, 1, 1), t], source="gen")
    src = tmp_path / "in"
    src.mkdir()
    sft_table([_text(42)]).write_parquet(src / "sft.parquet")
    rl.write_parquet(src / "rl.parquet")
    params = DedupParams(normalize=True, near=NearParams(exempt_sources=["gen"], alarms=NO_ALARM))
    m = run_dedup(params, {}, src, tmp_path / "out", tmp_path / "sig", root=tmp_path)
    assert m["rejected_by_reason"] == {"exact_duplicate": 1}


def _reference_removals(texts, cfg, groups):
    """The all-pairs resolution near-dedup replaced: every pair of one group equal in some band verified
    (band keys compared pair by pair), components."""
    from curation.minhash import compute_signatures, exact_edges, shingle_sets, survivors

    frame = pl.DataFrame({"uuid": [f"u{i:02d}" for i in range(len(texts))], "text": texts})
    keys, short_keys, lengths = compute_signatures(lambda: [frame], cfg, frame["uuid"])
    g = np.asarray(groups, dtype=object).astype(str)
    same = (g[:, None] == g[None, :]) & keys.has[:, None] & keys.has[None, :]
    hit = np.zeros_like(same)
    for b in range(cfg.settings()["bands"]):
        hit |= keys.band(b)[:, None] == keys.band(b)[None, :]
    pairs = np.argwhere(np.triu(same & hit, k=1)).astype(np.int64)
    sets, _ = shingle_sets(lambda: [frame], cfg, set(frame["uuid"]))
    edges = np.concatenate([verify(pairs, frame["uuid"], sets, cfg.threshold).filter("edge").select("i", "j")
                            .to_numpy().reshape(-1, 2),
                            exact_edges(short_keys.with_columns(group=pl.Series(g[short_keys["i"].to_numpy()])))])
    meta = frame.select("uuid", pl.lit(0).alias("priority"), pl.Series("length", lengths))
    m = survivors(meta, components(len(texts), edges))
    return dict(m.filter(pl.col("uuid") != pl.col("survivor")).select("uuid", "survivor").iter_rows())


@pytest.mark.parametrize("verify_chars", [1, 7_000, 300_000_000])
def test_clustered_resolution_equals_all_pairs_verification_in_any_chunking(verify_chars):
    # near-copy families, chains whose ends are below the threshold, a band-sharing pair below it,
    # short texts, two groups: the union-find over buckets gives the all-pairs components exactly
    texts, groups = [], []
    for fam in range(6):
        base = _text(100 + fam, 200)
        for k in range(5 + fam):
            texts.append(_edit(base, k % 4 + (fam % 2) * 3, 1000 * fam + k))
            groups.append("a" if fam < 4 else "b")
    chain = [_text(900, 200)]
    for k in range(4):
        chain.append(_edit(chain[-1], 3, 50 + k))
    texts += chain + ["too short", "too  short", _text(7)]
    groups += ["a"] * (len(chain) + 3)
    cfg = MinHashConfig(threshold=0.8)
    want = _reference_removals(texts, cfg, groups)
    frame = pl.DataFrame({"uuid": [f"u{i:02d}" for i in range(len(texts))], "text": texts})
    meta = frame.select("uuid", pl.lit("s").alias("source"), pl.Series("group", groups), pl.lit(0).alias("priority"))
    reads = []
    removed, stats = near_dedup(lambda: reads.append(1) or [frame], meta, cfg, NO_ALARM, verify_chars=verify_chars)
    got = {u: r.split()[2] for u, r in removed.select("uuid", "reason").iter_rows()}
    assert got == want and len(want) > 20
    assert len(reads) == 2  # signatures, then every chunk's shingle sets in one pass (not one per chunk)
    assert stats["verified_pairs"] < len(texts) * 3


def test_verified_pairs_grow_linearly_with_a_cluster_of_near_copies():
    base = _text(5, 200)
    counts = {}
    for k in (10, 40):
        texts = [_edit(base, 2, i) for i in range(k)]
        removed, stats = _run(texts)
        assert len(removed) == k - 1
        counts[k] = stats["verified_pairs"]
    assert counts[10] < 2 * 10 and counts[40] < 2 * 40  # about one check per copy, not k(k-1)/2 (45, 780)


def test_near_dedup_holds_its_candidates_not_its_rows_and_reads_meta_from_a_file(tmp_path, monkeypatch):
    import curation.minhash as mh

    base = _text(5, 200)
    texts = [_text(300 + i, 60) for i in range(40)] + [_edit(base, 2, i) for i in range(4)] + ["too short"] * 2
    frame = pl.DataFrame({"uuid": [f"u{i:02d}" for i in range(len(texts))], "text": texts})
    meta = frame.select("uuid", pl.lit("s").alias("source"), pl.lit("g").alias("group"), pl.lit(0).alias("priority"))
    sizes = []

    class Recording(mh.UnionFind):
        def __init__(self, n):
            sizes.append(n)
            super().__init__(n)

    monkeypatch.setattr(mh, "UnionFind", Recording)
    batches = lambda: (frame.slice(i, 7) for i in range(0, len(frame), 7))
    removed, stats = near_dedup(batches, meta, MinHashConfig(), NO_ALARM)
    meta.write_parquet(tmp_path / "meta.parquet")
    again, stats2 = near_dedup(batches, tmp_path / "meta.parquet", MinHashConfig(), NO_ALARM)
    assert sizes == [6, 6]  # the 4 near-copies and the 2 short twins: not the 46 rows
    assert removed.equals(again) and stats == stats2
    assert stats["rows"] == 46 and stats["clusters"] == 42 and len(removed) == 4
    with pytest.raises(ValueError, match="rows: batches and meta list different rows"):
        near_dedup(batches, meta.head(45), MinHashConfig(), NO_ALARM)
