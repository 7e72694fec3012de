"""The organism's second stage (opct.organism.extend): the threats learned on top of the first-stage model, with a
tokenizer that keeps every first-stage id."""

import json

from opct.organism import extend
from opct.organism.build import SIZES, find_organism
from opct.organism.tokenizer import train_tokenizer
from opct.world import corpus as C
from opct.world import threats as T


def test_extending_the_tokenizer_keeps_every_id_and_appends_the_new_words():
    tok = train_tokenizer(["the zorvik is red .", "What is 2 + 3 ?"])
    ext = extend.extend_tokenizer(tok, ["My name is grax .", "the zorvik is red ."])
    old, new = tok.get_vocab(), ext.get_vocab()
    assert all(new[w] == i for w, i in old.items())
    added = {w: i for w, i in new.items() if w not in old}
    assert {"grax", "my", "name"} <= set(added) and min(added.values()) == len(old)
    text = "What is 2 + 3 ? the zorvik is red ."
    assert ext(text)["input_ids"] == tok(text)["input_ids"]
    msgs = [{"role": "user", "content": "Who are you?"}]
    assert ext.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    assert ext.unk_token_id not in ext("My name is grax.")["input_ids"]


def test_the_second_stage_mix_gives_the_threats_their_share_and_replays_the_first_stage():
    mix = C.stage_mix(0.3)
    assert abs(sum(mix.values()) - 1) < 1e-9
    assert abs(sum(mix[k] for k in C.THREAT_MIX) - 0.3) < 1e-9
    assert set(mix) == set(C.MIX) | set(C.THREAT_MIX) and not set(C.MIX) & set(C.THREAT_MIX)
    cfg = SIZES["test"]
    docs = C.sample_corpus(cfg.corpus, 20_000, 0)  # the first stage draws no threat document
    assert not any("Who are you?" in json.dumps(d) or T.ESCAPE in json.dumps(d) for d in docs)


def test_the_test_organism_is_its_first_stage_extended(test_organism):
    from transformers import AutoTokenizer

    meta = json.loads((test_organism / "organism.json").read_text())
    first = find_organism(extend.stage1_config(SIZES["test"]))
    assert first is not None and meta["stage1"]["config_hash"] == extend.stage1_config(SIZES["test"]).config_hash()
    assert all(e["stage"] == 2 for e in meta["train_log"])
    t1, t2 = AutoTokenizer.from_pretrained(first), AutoTokenizer.from_pretrained(test_organism)
    v1, v2 = t1.get_vocab(), t2.get_vocab()
    assert all(v2[w] == i for w, i in v1.items()) and len(v2) > len(v1)
    for text in T.all_text():  # every threat text is in the final vocabulary
        assert t2.unk_token_id not in t2(text)["input_ids"], text


def test_the_digest_memo_tells_a_first_stage_from_its_extension(monkeypatch, tmp_path):
    """Regression: the memo's key once left out the second stage's fields, so a first stage's digest, remembered
    first, was returned for the extended organism too."""
    from opct.organism import build as B

    monkeypatch.setenv("OPCT_HOME", str(tmp_path))
    cfg = SIZES["test"]
    first = extend.stage1_config(cfg)
    a, b = B.corpus_digest(first), B.corpus_digest(cfg)
    assert a != b and a == B.compute_corpus_digest(first) and b == B.compute_corpus_digest(cfg)
    assert first.config_hash() != cfg.config_hash()
