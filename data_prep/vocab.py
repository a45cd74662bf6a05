"""SentencePiece unigram vocabularies per task, with fairseq's dictionary ids.

ASR: trained on the source transcripts; ST: on the targets (fairseq's MuST-C recipe: 5000 /
8000 pieces, character coverage 1.0). Ids 0..3 are <s>, <pad>, </s>, <unk> as in fairseq, so
a piece id is the model's token id.
"""

import os

from multiformer_common.errors import InvalidValue, MissingInput
from multiformer_common.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
LANG_TAG = "<lang:{}>"   # fairseq's target-language tag (prepend_tgt_lang_tag)


def lang_tag(language: str) -> str:
  return LANG_TAG.format(language)


def train_sentencepiece(texts, model_prefix: str, vocab_size: int,
                        user_symbols: tuple[str, ...] = ()) -> str:
  """Trains `{model_prefix}.model` (atomically); returns its path. If the text is too small
  for `vocab_size`, SentencePiece keeps the pieces it can (the real size is in the model).
  `user_symbols` (e.g. target-language tags) become single pieces of their own."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  texts = [t for t in texts if t.strip()]
  if not texts:
    raise InvalidValue(f"no text to train the SentencePiece model {model_prefix}")
  tmp_prefix = model_prefix + ".tmp"
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_prefix=tmp_prefix, vocab_size=vocab_size,
      model_type="unigram", character_coverage=1.0, bos_id=BOS_ID, pad_id=PAD_ID,
      eos_id=EOS_ID, unk_id=UNK_ID, hard_vocab_limit=False, num_threads=2,
      minloglevel=2, input_sentence_size=1_000_000, shuffle_input_sentence=True,
      **({"user_defined_symbols": list(user_symbols)} if user_symbols else {}))
  for ext in (".model", ".vocab"):
    os.replace(tmp_prefix + ext, model_prefix + ext)
  return model_prefix + ".model"


class Vocabulary:
  """Text <-> ids with a trained SentencePiece model (ids are fairseq's)."""

  def __init__(self, model_path: str):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    if not os.path.isfile(model_path):
      raise MissingInput(f"SentencePiece model {model_path} not found; run data_prep."
                              f"prepare first")
    self.path = model_path
    self.sp = spm.SentencePieceProcessor(model_file=model_path)
    prefix, suffix = LANG_TAG.split("{}")
    self.lang_tag_ids = frozenset(
        i for i in range(self.sp.get_piece_size())
        if self.sp.id_to_piece(i).startswith(prefix) and self.sp.id_to_piece(i).endswith(suffix))

  @property
  def size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self.sp.encode(text)

  def symbol_id(self, symbol: str) -> int | None:
    """The id of a whole-piece symbol (e.g. a language tag), or None if the model lacks it."""
    piece = self.sp.piece_to_id(symbol)
    return piece if piece != UNK_ID and self.sp.id_to_piece(piece) == symbol else None

  def decode(self, ids) -> str:
    """Text of token ids without specials and language tags (fairseq strips the tags from
    the output of a model trained with prepend_tgt_lang_tag: symbols_to_strip_from_output)."""
    ids = [int(i) for i in ids if int(i) not in (BOS_ID, PAD_ID, EOS_ID)
           and int(i) not in self.lang_tag_ids]
    return self.sp.decode(ids)


class DictionaryVocabulary(Vocabulary):
  """A SentencePiece model read through a fairseq dictionary (.txt, one "piece count" line
  each): ids are <s> <pad> </s> <unk> and then the lines in order, as fairseq's Dictionary
  numbers them, whatever the SentencePiece model's own ids. A piece the dictionary lacks is
  <unk>."""

  def __init__(self, model_path: str, dictionary_path: str):
    super().__init__(model_path)
    self.dictionary_path = dictionary_path
    symbols = ["<s>", "<pad>", "</s>", "<unk>"]
    with open(dictionary_path, encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        line = line.rstrip("\n")
        if not line.strip():
          continue
        symbol = line.rsplit(" ", 1)[0] if " " in line else line
        if not symbol:
          raise InvalidValue(f"{dictionary_path}:{number}: {line!r} is not 'symbol count'")
        symbols.append(symbol)
    self.symbols = symbols
    self.ids = {symbol: i for i, symbol in enumerate(symbols)}
    prefix, suffix = LANG_TAG.split("{}")
    self.lang_tag_ids = frozenset(i for i, s in enumerate(symbols)
                                  if s.startswith(prefix) and s.endswith(suffix))

  @property
  def size(self) -> int:
    return len(self.symbols)

  def encode(self, text: str) -> list[int]:
    return [self.ids.get(piece, UNK_ID) for piece in self.sp.encode(text, out_type=str)]

  def symbol_id(self, symbol: str) -> int | None:
    return self.ids.get(symbol)

  def decode(self, ids) -> str:
    pieces = [self.symbols[int(i)] for i in ids
              if int(i) not in (BOS_ID, PAD_ID, EOS_ID) and int(i) not in self.lang_tag_ids
              and 0 <= int(i) < len(self.symbols)]
    return self.sp.decode_pieces(pieces)


def load(prepared_dir: str, entry: dict) -> Vocabulary:
  """The vocabulary a prepared dataset's summary names (`prepared.json`'s vocab[task]): this
  project's SentencePiece model, or a fairseq model with its dictionary."""
  model = os.path.join(prepared_dir, entry["model"])
  if entry.get("dictionary"):
    return DictionaryVocabulary(model, os.path.join(prepared_dir, entry["dictionary"]))
  return Vocabulary(model)
