"""The embedded corpus: English (or de/es/fr/it/pt) speech with its human translation, built on
this machine from what the package registries install, nothing downloaded from a dataset hub.

- spec.py      CorpusSpec: every setting, defined once (config keys data.embedded.*, CLI flags)
- text/        the sentence pairs: message catalogs, the Ding dictionary, the Bible
- voices/      the speakers: espeak-ng, flite, festival, MBROLA, RHVoice behind one registry
- plan.py      who speaks what, in which split
- build.py     the build in MuST-C's layout (python -m data_prep.embedded --out DIR)
- speak.py     a text file's lines recorded by any voice (python -m data_prep.embedded.speak)

Packages are fetched into one cache (multiformer_common.packages.cache_root()).
"""
