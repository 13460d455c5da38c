"""A ``__del__`` that raises while the interpreter shuts down."""


class Session:
    def __del__(self) -> None:
        raise RuntimeError("runtime already torn down")


session = Session()
print("done", flush=True)
