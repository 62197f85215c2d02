//! model store.
