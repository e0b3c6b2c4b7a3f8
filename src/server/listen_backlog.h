// The kernel's queue of connections not yet accepted, for the server's listening socket.
#pragma once

namespace diffuse::server {

// cpp-httplib 0.11 (Debian 12's) listens with a backlog of 5: a burst of 40 clients gets TCP
// resets instead of queueing for the 503 back-pressure answer. Linux lets a listening socket's
// backlog be raised by calling listen() again; this finds this process's socket listening on
// `port` and raises it to SOMAXCONN. Returns whether one was found.
bool widen_listen_backlog(int port);

}  // namespace diffuse::server
