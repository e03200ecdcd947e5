"""A fork server for the suite's zarr-python 2.18 snippets (``conftest.zarr2``), run by
``.venv-zarr2``'s interpreter: ``python zarr2_forks.py SOCKET``.

Starting that interpreter and importing numpy and zarr 2.18 is 0.3 s of CPU, and the suite runs
a few hundred snippets; this process imports them once, then forks a child per connection to
``SOCKET``, which runs one snippet as ``python -c PROG ARGV...`` would: in its own process, with
the environment and working directory of the caller, its output in a file the caller names.

Protocol (one connection, one snippet): the caller sends one JSON line ``{"prog", "argv", "env",
"cwd", "output"}``; the child answers its pid (a line), runs the snippet, then answers its exit
status (a line: 1 for an uncaught exception, its traceback in the output, as ``python -c``).
The server ends when its standard input (a pipe from the process that started it) closes.
"""

import json
import os
import select
import socket
import sys
import traceback

import numpy  # noqa: F401  (imported once, for every snippet)
import zarr  # noqa: F401


def run(conn: socket.socket) -> int:
    """Run the snippet ``conn`` sends, in this (forked) process: its exit status."""
    request = json.loads(conn.makefile("rb").readline())
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    nothing = os.open(os.devnull, os.O_RDONLY)  # (not the server's standard input)
    os.dup2(nothing, 0)
    os.close(nothing)
    conn.sendall(b"%d\n" % os.getpid())
    sys.argv = ["-c", *request["argv"]]
    sys.path[0] = ""  # as ``python -c``: the working directory, not this file's
    code = 0
    try:
        exec(compile(request["prog"], "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # ``sys.exit("message")``
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    conn.sendall(b"%d\n" % code)
    return code


def main(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:  # the caller has gone
            return
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            code = 1
            try:
                code = run(conn)
            finally:
                os._exit(code)
        conn.close()
        while True:  # reap the children that have ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


if __name__ == "__main__":
    main(sys.argv[1])
