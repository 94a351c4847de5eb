//! What a session will likely run next, from what it ran and the data it holds.
