//! Preprocessing: chat templates, tokenization and incremental detokenization.
