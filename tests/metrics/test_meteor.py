"""METEOR 1.5 in pure Python: equal to pycocoevalcap's jar (where Java runs), its rules on hand-made cases, its
language-data cache, and `itune score` reporting it by default."""

from __future__ import annotations

import gzip
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from itune_hf.cli import main
from itune_hf.metrics import java_metrics, score_captions, tokenize_captions
from itune_hf.metrics.meteor import MeteorScorer, language_data, meteor_score, scoring, unavailable_reason
from itune_hf.metrics.meteor.align import morph_base
from itune_hf.metrics.meteor.corpus import HARD_CASES, make_meteor_corpus
from itune_hf.metrics.meteor.normalize import java_hash, java_split_words, java_trim, normalize_line
from itune_hf.metrics.synthetic import make_corpus

REASON = unavailable_reason()
requires_data = pytest.mark.skipif(REASON is not None, reason=str(REASON))
JAVA_REASON = java_metrics.unavailable_reason("METEOR")


@pytest.fixture(scope="module")
def scorer():
    if REASON is not None:
        pytest.skip(REASON)
    return MeteorScorer()


def _module_counts(stats):
    """(hypothesis, reference) words matched by each module: exact, stem, synonym, paraphrase."""
    return [(stats[4 + 4 * m] + stats[6 + 4 * m], stats[5 + 4 * m] + stats[7 + 4 * m]) for m in range(4)]


# ------------------------------------------------------------------------------------------------- the jar's rules


def test_java_string_rules():
    assert java_hash("") == 0
    assert java_hash("hello") == 99162322  # "hello".hashCode()
    assert java_hash("Aa") == java_hash("BB") == 2112  # a collision the jar treats as an exact match
    assert java_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # UTF-16 code units, not code points
    assert java_hash("polygenelubricants") == -(1 << 31)  # wraps as a signed 32-bit int
    assert java_hash("\ud800") == 0xD800  # a lone surrogate (JSON allows one) hashes as in Java
    assert java_trim("\x01 a b \x1f\t") == "a b"  # everything up to U+0020 goes, nothing else
    assert java_trim("\u00a0a\u00a0") == "\u00a0a\u00a0"
    assert java_split_words(" a\u00a0b\tc\x0bd\n") == ["a\u00a0b", "c\x0bd"]  # StringTokenizer's five delimiters


def test_normalisation_rules():
    prefixes = {"Mr": 1, "No": 2, "e.g": 1}
    cases = {  # what the jar's Normalizer class prints for each
        "Mr. Smith went to the U.S. yesterday.": "Mr. Smith went to the US yesterday .",  # nonbreaking; U.S. -> US
        "It's 1,000 dogs, cats and 3.5 birds.": "It 's 1,000 dogs , cats and 3.5 birds .",
        "No. 5 and No. more": "No. 5 and No. more",  # numeric-only before a number; any dot before a lower-case word
        "No. Five": "No . Five",
        "wait... what?!": "wait ... what ? !",
        "a x-ray \u2013 U.S.-based": "a x ray - US based",
        "\u201cquoted\u201d `single\u2019": "\" quoted \" ' single '",
        "1990's rock'n'roll": "1990 's rock 'n'roll",  # one pass: the second apostrophe's letter was consumed
        "don't": "don 't",
        "e.g. lower follows": "eg lower follows",  # dots inside a word with letters are dropped
        "end.": "end .",
    }
    assert {line: normalize_line(line, prefixes) for line in cases} == cases


def test_wordnet_suffix_rules():
    synsets = {"dog": (1,), "church": (2,), "fly": (3,), "make": (4,), "big": (5,)}
    assert morph_base("dogs", synsets) == "dog"
    assert morph_base("churches", synsets) == "church"
    assert morph_base("flies", synsets) == "fly"
    assert morph_base("making", synsets) == "make"
    assert morph_base("bigger", synsets) == ""  # "bigg" has no synonym sets; no rule undoubles
    assert morph_base("glass", synsets) == "glass"  # words ending in "ss" are their own base
    assert morph_base("is", synsets) == "is"  # so are words of two letters or fewer


def test_score_of_hand_counted_statistics():
    # "a zorp" against "a blick": one exact match of the function word "a" in one chunk
    stats = [2, 2, 1, 1, 0, 0, 1, 1] + [0] * 12 + [1, 1, 1]
    # weighted lengths 0.75 * 1 + 0.25 * 1 = 1; weighted matches 0.25; P = R = Fmean = 0.25;
    # fragmentation 1 chunk / 1 matched word: penalty 0.6 * 1 ** 0.2 = 0.6; score 0.25 * 0.4
    assert meteor_score(stats) == pytest.approx(0.1, abs=1e-15)
    perfect = [3, 3, 0, 0, 3, 3, 0, 0] + [0] * 12 + [1, 3, 3]
    assert meteor_score(perfect) == 1.0  # every word in one chunk: no fragmentation penalty
    assert meteor_score([0] * 23) == 0.0  # 0 / 0 is NaN in Java, and a NaN score is 0
    corpus = scoring.corpus_statistics([perfect, stats])
    assert corpus[-3] == 1  # the perfect segment's chunk is not added


@requires_data
def test_each_module_matches_what_it_should(scorer):
    predictions, references = make_meteor_corpus(100, 5, seed=5, data=scorer.data)
    stats = scorer.statistics([predictions[i] for i in references], [references[i] for i in references])
    totals = [sum(counts) for counts in zip(*(sum(_module_counts(s), ()) for s in stats))]
    assert all(total > 0 for total in totals), totals  # exact, stem, synonym and paraphrase all match somewhere
    (stats,) = scorer.statistics(["a dog sits in the automobile"], [["a dog sits in the car"]])
    assert _module_counts(stats) == [(5, 5), (0, 0), (1, 1), (0, 0)]  # WordNet: automobile / car
    # The jar's quirk, kept: a one-word non-exact match that another match overlaps adds int(0 + 0.5) = 0 to the
    # search's count, and the path that skips it has one chunk fewer, so "dogs" (stem and synonym of "dog") is unmatched
    assert scorer.compute_score({1: ["dog"]}, {1: ["dogs"]}) == (0.0, [0.0])
    assert scorer.compute_score({1: ["a blick"]}, {1: ["a zorp"]}) == (pytest.approx(0.1), [pytest.approx(0.1)])
    assert scorer.compute_score({1: ["a dog"]}, {1: [""]})[0] == 0.0


@requires_data
def test_best_reference_and_corpus_score(scorer):
    gts = {1: ["a zorp", "a dog runs"], 2: ["two cats sit"]}
    res = {1: ["a dog runs"], 2: ["two cats sit on a mat"]}
    corpus, per_image = scorer.compute_score(gts, res)
    assert per_image[0] == 1.0  # the best of the image's references counts
    assert 0 < per_image[1] < 1
    assert corpus != pytest.approx(sum(per_image) / 2)  # from summed statistics, not the mean of the scores
    with pytest.raises(ValueError, match="image 2 has 2"):
        scorer.compute_score(gts, {1: ["a"], 2: ["b", "c"]})


# --------------------------------------------------------------------------------------------------- parity


def _parity_corpora(scorer):
    """Four corpora, 1,123 images: COCO-like captions through the PTB tokenizer (what `itune score` sends), raw
    captions dense with punctuation and unicode, captions made to match through every module, the hand-written
    cases."""
    corpora = {}
    predictions, references = make_corpus(400, 5, seed=1)
    ids = list(predictions)
    tokens = tokenize_captions([predictions[i] for i in ids] + [r for i in ids for r in references[i]])
    rest = iter(tokens[len(ids) :])
    tokenized_references = {i: [next(rest) for _ in references[i]] for i in ids}
    corpora["COCO-like, PTB-tokenised"] = (dict(zip(ids, tokens)), tokenized_references)
    predictions, references = make_corpus(300, 5, seed=2, hard=True)
    line = lambda text: text.replace("\n", " ").replace("\r", " ")  # noqa: E731 (pycocoevalcap writes one line)
    corpora["edge cases, raw"] = (
        {i: line(p) for i, p in predictions.items()},
        {i: [line(r) for r in refs] for i, refs in references.items()},
    )
    corpora["every module"] = make_meteor_corpus(400, 5, seed=3, data=scorer.data)
    corpora["hand-written"] = (
        {i: p for i, (p, _) in enumerate(HARD_CASES)},
        {i: list(refs) for i, (_, refs) in enumerate(HARD_CASES)},
    )
    return corpora


@pytest.mark.slow
@pytest.mark.skipif(JAVA_REASON is not None, reason=f"the jar cannot run here: {JAVA_REASON}")
def test_equal_to_the_jar_on_every_caption(scorer):
    from pycocoevalcap.meteor.meteor import Meteor

    jar, images = Meteor(), 0  # one JVM for every corpus
    try:
        for name, (predictions, references) in _parity_corpora(scorer).items():
            gts, res = references, {key: [predictions[key]] for key in references}
            expected, expected_per_image = jar.compute_score(gts, res)
            score, per_image = scorer.compute_score(gts, res)
            assert score == pytest.approx(expected, abs=1e-12), name
            assert per_image == pytest.approx(expected_per_image, abs=1e-12), name
            images += len(gts)
    finally:
        del jar
    assert images >= 1000


@pytest.mark.slow
@pytest.mark.skipif(JAVA_REASON is not None, reason=f"the jar cannot run here: {JAVA_REASON}")
def test_normalisation_equal_to_the_jars(scorer):
    predictions, references = make_corpus(300, 5, seed=4, hard=True)
    lines = [java_trim(c.replace("\n", " ").replace("\r", " ")) for refs in references.values() for c in refs]
    lines += [line for _, refs in HARD_CASES for line in refs]
    normalizer = ["java", "-Dfile.encoding=UTF-8", "-cp", str(language_data.meteor_sources().jar)]
    out = subprocess.run(
        [*normalizer, "edu.cmu.meteor.util.Normalizer", "english", "true"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, encoding="utf-8", check=True,
    ).stdout.split("\n")[:-1]  # fmt: skip
    assert [normalize_line(line, scorer.data.prefixes) for line in lines] == out


# --------------------------------------------------------------------------------------- language data and cache


def _fake_pycocoevalcap(root: Path, entries: list[tuple[str, str]]) -> language_data.MeteorSources:
    """A pycocoevalcap-shaped METEOR folder with a few words of data."""
    folder = root / "meteor"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "meteor-1.5.jar", "w") as jar:
        jar.writestr("function/english.words", "a\nthe\n")
        jar.writestr("nonbreaking/english.prefixes", "# comment\nMr\nNo #NUMERIC_ONLY#\n")
        jar.writestr("synonym/english.exceptions", "mouse\nmice\n")
        jar.writestr("synonym/english.synsets", "car\n1 2\nautomobile\n2\nmouse\n7\nrodent\n7\n")
    with gzip.open(folder / "data" / "paraphrase-en.gz", "wt", encoding="utf-8") as table:
        for phrase, paraphrase in entries:
            table.write(f"0.5\n{phrase}\n{paraphrase}\n")
    return language_data.MeteorSources(folder / "meteor-1.5.jar", folder / "data" / "paraphrase-en.gz")


def test_cache_is_built_once_and_keyed_by_the_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    entries = [("big dog", "large hound"), ("big dog", "great dog"), ("cat", "feline"), ("x y z", "w")]
    sources = _fake_pycocoevalcap(tmp_path / "pkg", entries)
    killed = tmp_path / "cache" / "meteor" / ".en-0123456789abcdef-killed"  # what a builder killed mid-way leaves
    killed.mkdir(parents=True)
    data = language_data.load_language_data(sources)
    assert not killed.exists()
    assert data.function_words == {"a", "the"}
    assert data.prefixes == {"Mr": 1, "No": 2}
    assert data.exceptions == {"mice": ["mouse"]}
    assert data.synsets["car"] == (1, 2)
    assert data.paraphrases.longest_phrase == 3
    # only the pairs both of whose sides occur in the corpus, in table order
    captions = [("a", "big", "dog"), ("a", "large", "hound"), ("great", "dog"), ("cat",)]
    assert data.paraphrases.select(captions) == {("big", "dog"): [("large", "hound"), ("great", "dog")]}
    monkeypatch.setattr(language_data, "build_cache", lambda *a: pytest.fail("the cache was built again"))
    assert language_data.load_language_data(sources).folder == data.folder
    monkeypatch.undo()
    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    sources = _fake_pycocoevalcap(tmp_path / "pkg", entries[:1])  # the table changed: another cache
    assert language_data.load_language_data(sources).folder != data.folder
    # a damaged cache (a truncated array) is built again, once
    damaged = language_data.load_language_data(sources).folder
    (damaged / "phrase_hashes.npy").write_bytes(b"\x93NUMPY")
    assert language_data.load_language_data(sources).paraphrases.select([("big", "dog")]) == {}
    assert (damaged / "phrase_hashes.npy").stat().st_size > 10
    # a builder that finds the folder already written by another process keeps that one
    language_data.build_cache(sources, data.folder)
    assert sorted(p.name for p in data.folder.parent.iterdir() if not p.name.startswith(".")) == sorted(
        [data.folder.name, language_data.load_language_data(sources).folder.name]
    )


def test_scorer_on_the_fake_data_uses_every_module(tmp_path, monkeypatch):
    if REASON is not None and "snowballstemmer" in REASON:
        pytest.skip(REASON)
    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    sources = _fake_pycocoevalcap(tmp_path / "pkg", [("big dog", "large hound")])
    monkeypatch.setattr(scoring, "meteor_sources", lambda: sources)
    fake = MeteorScorer()
    hypothesis, reference = "the large hound walks a automobile with mice", "the big dog walking a car with rodents"
    (stats,) = fake.statistics([hypothesis], [[reference]])
    exact, stem, synonym, paraphrase = _module_counts(stats)
    assert exact == (3, 3)  # the, a, with
    assert stem == (1, 1)  # walks / walking: both stem to "walk"
    assert synonym == (2, 2)  # automobile / car; mice (an irregular form of mouse) / rodents (rodent, by suffix)
    assert paraphrase == (2, 2)  # large hound / big dog


def test_unavailable_without_pycocoevalcap_or_the_jars_stemmer(monkeypatch):
    monkeypatch.setattr(scoring, "meteor_sources", lambda: "METEOR reads its language data from pycocoevalcap, ...")
    assert score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR"])["METEOR"] == (
        "unavailable: METEOR reads its language data from pycocoevalcap, ..."
    )
    monkeypatch.undo()

    class Snowball3:
        def stemWord(self, word):  # noqa: N802 (snowballstemmer's name)
            return {"added": "add"}.get(word, word)

    snowballstemmer = pytest.importorskip("snowballstemmer")
    monkeypatch.setattr(snowballstemmer, "stemmer", lambda language: Snowball3())
    reason = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR"])["METEOR"]
    assert reason.startswith("unavailable: METEOR's stem module needs the jar's English Snowball algorithm")
    assert "'added' -> 'add'" in reason and "snowballstemmer>=2.2,<3" in reason


def test_a_meteor_that_fails_is_reported_not_raised(monkeypatch):
    import itune_hf.metrics.meteor as meteor

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/cache/meteor")

    monkeypatch.setattr(meteor, "unavailable_reason", lambda: None)
    monkeypatch.setattr(meteor, "MeteorScorer", unwritable)
    scores = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR", "BLEU"])
    reason = "unavailable: METEOR failed: PermissionError: [Errno 13] Permission denied: '/cache/meteor'"
    assert scores["METEOR"] == reason
    assert isinstance(scores["Bleu_1"], float)


# --------------------------------------------------------------------------------------------------- as users run it


@requires_data
def test_itune_score_reports_meteor_by_default(tmp_path, capsys, scorer):
    predictions = {1: "A dog runs on the grass.", 2: "Two cats sit on a mat."}
    references = {1: ["A dog is running on grass.", "The dog runs."], 2: ["Two kittens sitting on a rug."]}
    (tmp_path / "p.json").write_text(json.dumps([{"image_id": k, "caption": c} for k, c in predictions.items()]))
    annotations = [
        {"image_id": k, "id": 10 * k + i, "caption": c} for k, rs in references.items() for i, c in enumerate(rs)
    ]
    images = [{"id": k} for k in references]
    (tmp_path / "r.json").write_text(json.dumps({"images": images, "annotations": annotations}))
    assert main(["score", str(tmp_path / "p.json"), str(tmp_path / "r.json")]) == 0
    scores = json.loads(capsys.readouterr().out)
    tokens = tokenize_captions([*predictions.values(), *(r for refs in references.values() for r in refs)])
    expected = scorer.compute_score({1: tokens[2:4], 2: tokens[4:5]}, {1: [tokens[0]], 2: [tokens[1]]})[0]
    assert scores["METEOR"] == pytest.approx(expected, abs=1e-12)
    assert 0 < scores["METEOR"] < 1


def test_meteor_jar_stays_an_option():
    from itune_hf.metrics.registry import get_metric, normalize_metrics

    assert get_metric("meteor-jar").needs_java and "METEOR_jar" not in normalize_metrics(None)
