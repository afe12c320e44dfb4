"""Stand-ins shared by tests."""


class Terminal:
    """A stream that says it is a terminal and keeps what is written, for progress output."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass
