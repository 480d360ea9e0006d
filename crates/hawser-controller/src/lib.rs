//! The Hawser controller.
