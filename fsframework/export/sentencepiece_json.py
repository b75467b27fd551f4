"""A sentencepiece `.model` as a `tokenizer.json`, so transformers' `AutoTokenizer` reads an export
of a sentencepiece run as a fast tokenizer that encodes as sentencepiece does.

The pieces, scores and normalization come from the model's protobuf (sentencepiece ships its
schema), assembled as transformers' own `SpmConverter` assembles them (unigram or BPE, the
precompiled normalization map, whitespace collapsed, `▁` marking word starts), with sentencepiece's
byte fallback kept: a character outside the vocabulary becomes its UTF-8 bytes' pieces, as in
training. Done with `tokenizers` alone: exporting needs no transformers.
"""

from __future__ import annotations

from pathlib import Path

UNIGRAM, BPE = 1, 2  # sentencepiece's TrainerSpec.model_type
CONTROL, USER_DEFINED = 3, 4  # sentencepiece's SentencePiece.type of special pieces
SPACE = "▁"  # sentencepiece's word-start mark


def write_sentencepiece_json(model_file: Path, path: Path) -> None:
    """Write the sentencepiece model `model_file` as a `tokenizer.json` at `path`; ValueError for a
    model type other than unigram or BPE (word and char models have no tokenizers counterpart)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    scores = [(piece.piece, piece.score) for piece in proto.pieces]
    if trainer.model_type == UNIGRAM:
        tok = Tokenizer(models.Unigram(scores, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback))
    elif trainer.model_type == BPE:
        vocab = {piece: i for i, (piece, _) in enumerate(scores)}
        tok = Tokenizer(models.BPE(vocab, _merges(vocab, scores), unk_token=trainer.unk_piece, fuse_unk=True,
                                   byte_fallback=trainer.byte_fallback))
    else:
        raise ValueError(f"sentencepiece model {model_file} is of type {trainer.model_type} (word or char): "
                         "only unigram and BPE models can be exported for transformers")
    steps = [normalizers.Precompiled(normalizer.precompiled_charsmap)] if normalizer.precompiled_charsmap else []
    if normalizer.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), SPACE)]
    tok.normalizer = normalizers.Sequence(steps)
    prepend = "always" if normalizer.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=prepend,
                                                 split=trainer.split_by_whitespace)
    # as transformers decodes Llama's sentencepiece: marks to spaces, bytes to characters, the
    # dummy prefix's space dropped (a Metaspace decoder after Fuse drops every word's space)
    undo_prefix = [decoders.Strip(" ", 1, 0)] if normalizer.add_dummy_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     *undo_prefix])
    specials = [(p.piece, p.type == CONTROL) for p in proto.pieces if p.type in (CONTROL, USER_DEFINED)]
    tok.add_tokens([AddedToken(piece, normalized=False, special=special) for piece, special in specials])
    tok.save(str(path))


def _merges(vocab: dict[str, int], scores: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """The merges of a sentencepiece BPE model, which stores only pieces and scores: every split of
    a piece into two pieces, the better-scored piece's merges first (transformers' order)."""
    merges = []
    for piece, score in scores:
        pairs = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        merges += [(left, right, score) for left, right in sorted(pairs, key=lambda p: (vocab[p[0]], vocab[p[1]]))]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]
