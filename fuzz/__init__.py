"""Coverage-guided fuzzing (atheris) of the frame parser and connection state machine."""
