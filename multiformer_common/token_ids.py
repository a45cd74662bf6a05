"""The special token ids of every vocabulary (fairseq's dictionary order): the SentencePiece
models, the prepared targets, the model and the searches all use these."""

BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
CTC_BLANK_ID = BOS_ID   # fairseq's CTC blank: <s>, which no target contains
