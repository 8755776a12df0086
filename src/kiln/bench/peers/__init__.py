"""Other projects' engines run beside kiln's as peers: each from its own checkout, in its own
process, its version recorded; kiln only converts the model for it, starts it and reads its output."""
