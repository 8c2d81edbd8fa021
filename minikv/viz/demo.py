"""The incident in miniature, by hand, to read page maps on and test the pictures: alice's data stays in
decode's pages; bob, rejected at prefill, moves on anyway, and his decode step reads them."""

from minikv.engine.events import Event

E = Event  # short, so that each event fits on one line

MINIATURE_POOLS = {"prefill": 4, "decode": 8}  # pages per node
# Comments give each event's index in the list (the tests and the widget speak in indices).
MINIATURE_INCIDENT = [
    E(0, "prefill", "stage", "a1", "alice", (), "prefill.bootstrap"),                  # 0
    E(0, "prefill", "stage", "a1", "alice", (), "prefill.waiting"),                    # 1
    E(0, "prefill", "allocate", "a1", "alice", (0, 1), "2 pages for 20 tokens"),       # 2
    E(0, "prefill", "stage", "a1", "alice", (), "prefill.inflight"),                   # 3
    E(0, "prefill", "write", "a1", "alice", (0, 1), "prefill"),                        # 4
    E(1, "decode", "stage", "a1", "alice", (), "decode.prealloc"),                     # 5
    E(1, "decode", "allocate", "a1", "alice", (0, 1, 2), "3 pages for 40 tokens"),     # 6
    E(1, "decode", "stage", "a1", "alice", (), "decode.transfer"),                     # 7
    E(1, "decode", "write", "a1", "alice", (0, 1), "transfer"),                        # 8
    E(1, "prefill", "free", "a1", "alice", (0, 1), "transferred"),                     # 9
    E(2, "decode", "stage", "a1", "alice", (), "decode.running"),                      # 10
    E(2, "decode", "write", "a1", "alice", (1,), "decode"),                            # 11 (own page again)
    E(2, "decode", "read", "a1", "alice", (0, 1), "attend"),                           # 12
    E(3, "decode", "write", "a1", "alice", (2,), "decode"),                            # 13 (a new page)
    E(4, "decode", "free", "a1", "alice", (0, 1, 2), "finished (stop)"),               # 14
    E(4, "decode", "finish", "a1", "alice", (), "stop"),                               # 15
    E(5, "prefill", "stage", "b1", "bob", (), "prefill.bootstrap"),                    # 16
    E(5, "prefill", "reject", "b1", "bob", (), "prompt longer than the prefill pool"), # 17
    E(5, "prefill", "stage", "b1", "bob", (), "prefill.waiting"),                      # 18
    E(5, "prefill", "allocate", "b1", "bob", (0,), "1 page for a placeholder"),       # 19
    E(5, "prefill", "write", "b1", "bob", (0,), "placeholder"),                        # 20
    E(6, "decode", "stage", "b1", "bob", (), "decode.prealloc"),                       # 21
    E(6, "decode", "allocate", "b1", "bob", (2, 1, 0, 3), "4 pages for 60 tokens"),    # 22
    E(6, "decode", "stage", "b1", "bob", (), "decode.transfer"),                       # 23
    E(6, "decode", "write", "b1", "bob", (2,), "transfer: 1 page"),                    # 24
    E(6, "prefill", "free", "b1", "bob", (0,), "transferred"),                         # 25
    E(7, "decode", "stage", "b1", "bob", (), "decode.running"),                        # 26
    E(7, "decode", "read", "b1", "bob", (2, 1, 0), "attend"),                          # 27
    E(7, "decode", "cross_read", "b1", "bob", (0, 1), "victim=alice/a1"),              # 28
    E(8, "decode", "free", "b1", "bob", (2, 1, 0, 3), "finished (length)"),            # 29
    E(8, "decode", "finish", "b1", "bob", (), "length"),                               # 30
]
