"""Offline tokenizers of the three kinds real models use, for the tiny models: a GPT-2-style byte-level BPE
(GPT-2, Qwen2, RoBERTa, Llama 3) and a SentencePiece-style Unigram over Metaspace pieces (DeBERTa-v3, XLNet,
ALBERT, Llama 2), next to MiniLM's WordPiece (BERT) that the other tiny models use. Each is trained here, in
milliseconds, on :data:`CORPUS` (fixed text: the generated tasks' words and some English with contractions,
capitals and punctuation), with a small vocabulary, so that words really split into several sub-words.

Training is deterministic (the same files, hence the same model-folder digest, on every run), and the result
is a ``PreTrainedTokenizerFast`` saved with the tiny model's snapshot like any hub tokenizer."""

from __future__ import annotations

import functools
import math
import string

CORPUS = (
    "last night the hotel was nice , but the coffee was not really good .",
    "i think it is a poor pizza . the soup was awful and the service was slow .",
    "the movie was truly wonderful ; the film was dull , boring and far too long .",
    "yesterday , the king was helped by the bird . the teacher helped the horse in the park .",
    "grace bought the ball from john . who is holding the ball now ?",
    "peter lent frank the box . who has the box at the end ? anna gave mary a book .",
    "the girl hugged the dog , the cat chased the mouse and the lion attacked the farmer .",
    "emma sold her phone to david ; tom threw the key to lucy , who grabbed it .",
    "the queen visited the school every morning . the boy kicked the coin into the river .",
    "\"It's great,\" she said. \"Honestly, I don't know what they're doing.\"",
    "We can't go, and he won't stay; you'd think they'd've called (or written) by now!",
    "The U.S. economy grew 3.5% in 2019, according to the report -- a $1,000 rise per person.",
    "Isn't it lovely? Yes... it's an enjoyable, pleasant, quiet day in the sunny park.",
    "Dr. Smith's students aren't sure: \"Who took Alice's bag?\" [Nobody knows.]",
    "Overall, the meal was excellent & the wine was terrible -- but the dessert? Interesting!",
    "She'll be here at 10:30 a.m.; we're late, I'm afraid, and you've missed the train.",
    "Transformers tokenize unbelievably long words into several sub-words: antidisestablishmentarianism.",
    "Mike, Sarah, Carol, Henry and Bob met the doctor and the woman near the river last week.",
)
# The specials of each layout, in id order: DeBERTa-v2/v3's [CLS] A [SEP] B [SEP]; XLNet's A <sep> B <sep> <cls>.
_UNIGRAM_SPECIALS = {"bert": ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"),
                     "xlnet": ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>")}
BYTE_BPE, UNIGRAM_BERT, UNIGRAM_XLNET = "byte_bpe", "unigram_bert", "unigram_xlnet"
# Architecture -> the kind of tokenizer its real checkpoints ship (absent: MiniLM's WordPiece).
TOKENIZER_KINDS = {"gpt2": BYTE_BPE, "qwen2": BYTE_BPE, "deberta-v2": UNIGRAM_BERT, "xlnet": UNIGRAM_XLNET}


@functools.lru_cache(maxsize=None)
def _trained(kind: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if kind == BYTE_BPE:
        # GPT-2's: bytes mapped to printable characters, a leading space kept in the piece ("Ġgreat"); no
        # tokens added around the text; <|endoftext|> is bos, eos and (as GPT-2's folders get) pad.
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False))
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return tok
    specials = _UNIGRAM_SPECIALS["bert" if kind == UNIGRAM_BERT else "xlnet"]
    unk = specials[3] if kind == UNIGRAM_BERT else specials[0]
    # SentencePiece's: whitespace becomes "▁", prepended to every word; unseen characters are the unk piece.
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    # The pieces come from a BPE trainer (deterministic; tokenizers' Unigram trainer is not: its scores vary
    # in the third decimal from run to run, and so would the folder's digest); each piece's score is the log of
    # its relative frequency as a substring of the corpus' words, a unigram LM without EM re-estimation.
    pieces = Tokenizer(models.BPE())
    pieces.pre_tokenizer = metaspace
    pieces.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=list(string.ascii_letters + string.digits
                                                                   + string.punctuation + "▁")))
    words = [word for text in CORPUS for word, _ in metaspace.pre_tokenize_str(text)]
    counts = {piece: 1 + sum(word.count(piece) for word in words) for piece in pieces.get_vocab()}
    total = sum(counts.values())
    scored = sorted(((piece, math.log(count / total)) for piece, count in counts.items()), key=lambda p: (-p[1], p[0]))
    tok = Tokenizer(models.Unigram([(token, 0.0) for token in specials] + scored, unk_id=specials.index(unk)))
    tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(list(specials))
    ids = {token: tok.token_to_id(token) for token in specials}
    if kind == UNIGRAM_BERT:
        single, pair, used = "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", ("[CLS]", "[SEP]")
    else:  # XLNet's: the summary token last (its head reads position -1), segment 2
        single, pair, used = "$A <sep> <cls>:2", "$A <sep> $B:1 <sep>:1 <cls>:2", ("<sep>", "<cls>")
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=[(t, ids[t]) for t in used])
    return tok


def tiny_tokenizer(architecture: str, wordpiece_dir) -> tuple:
    """(tokenizer, special ids for the config) of a tiny `architecture`: a fresh ``PreTrainedTokenizerFast`` of
    the kind its real checkpoints use (:data:`TOKENIZER_KINDS`) and its bos/eos ids, or the WordPiece tokenizer
    saved in `wordpiece_dir` (MiniLM's) and no ids (the config's defaults are MiniLM's)."""
    from transformers import AutoTokenizer

    kind = TOKENIZER_KINDS.get(architecture)
    if kind is None:
        return AutoTokenizer.from_pretrained(wordpiece_dir), {}
    tokenizer = _wrapped(kind)
    return tokenizer, {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}


def _wrapped(kind: str):
    from transformers import PreTrainedTokenizerFast

    backend = _trained(kind).__class__.from_str(_trained(kind).to_str())  # a copy: callers may change it
    if kind == BYTE_BPE:
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                       unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    inputs = ["input_ids", "token_type_ids", "attention_mask"]
    if kind == UNIGRAM_BERT:
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                       unk_token="[UNK]", mask_token="[MASK]", bos_token="[CLS]", eos_token="[SEP]",
                                       model_input_names=inputs)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", cls_token="<cls>", sep_token="<sep>",
                                   unk_token="<unk>", mask_token="<mask>", bos_token="<s>", eos_token="</s>",
                                   padding_side="left", model_input_names=inputs)

