"""A tiny fake trainmeter agent for tests: a real Unix stream socket server."""

import json
import os
import socket
import threading
import time


def strict_loads(line):
    """json.loads that rejects NaN/Infinity (what a strict agent would do)."""

    def bad(c):
        raise ValueError("non-standard JSON constant %s" % c)

    return json.loads(line, parse_constant=bad)


class FakeAgent:
    """Accepts connections on `path`; each connection's lines are recorded.

    read=False: accept but never read (simulates a wedged agent).
    """

    def __init__(self, path, read=True, rcvbuf=None):
        self.path = path
        self.read = read
        self.conns = []  # list of dicts: {"sock":..., "lines": [bytes]}
        self._cv = threading.Condition()
        self._closed = False
        if os.path.exists(path):
            os.unlink(path)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.srv.bind(path)
        self.srv.listen(16)
        self._t = threading.Thread(target=self._accept_loop, daemon=True)
        self._t.start()

    def _accept_loop(self):
        while True:
            try:
                s, _ = self.srv.accept()
            except OSError:
                return
            c = {"sock": s, "lines": []}
            with self._cv:
                self.conns.append(c)
                self._cv.notify_all()
            if self.read:
                threading.Thread(target=self._read_loop, args=(c,), daemon=True).start()

    def _read_loop(self, c):
        buf = b""
        s = c["sock"]
        while True:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._cv:
                    c["eof"] = True
                    self._cv.notify_all()
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self._cv:
                    c["lines"].append(line)
                    self._cv.notify_all()

    # --- helpers for tests

    def wait(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        with self._cv:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def wait_conns(self, n, timeout=5.0):
        return self.wait(lambda: len(self.conns) >= n, timeout)

    def wait_lines(self, conn_index, n, timeout=5.0):
        return self.wait(
            lambda: len(self.conns) > conn_index and len(self.conns[conn_index]["lines"]) >= n, timeout
        )

    def wait_eof(self, conn_index, timeout=5.0):
        return self.wait(lambda: len(self.conns) > conn_index and self.conns[conn_index].get("eof"), timeout)

    def events(self, conn_index=0):
        with self._cv:
            return [strict_loads(l.decode()) for l in self.conns[conn_index]["lines"]]

    def raw_lines(self, conn_index=0):
        with self._cv:
            return list(self.conns[conn_index]["lines"])

    def send(self, obj, conn_index=0):
        data = (json.dumps(obj) + "\n").encode()
        self.conns[conn_index]["sock"].sendall(data)

    def close(self):
        """Stop listening and close every connection (agent 'crash')."""
        try:
            self.srv.close()
        except OSError:
            pass
        for c in self.conns:
            try:
                c["sock"].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c["sock"].close()
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass
