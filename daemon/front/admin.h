// The daemon's side of pxctl: the admin requests a connection may send instead of a Hello
// (control.fbs: AdminRequest), answered from the daemon's state (observe/daemon_state.h),
// and the hooks through which the observer (observe/observer.h) reads that state.
#pragma once

#include <memory>

#include "daemon/front/config.h"
#include "daemon/observe/observer.h"
#include "transport/ipc/control_channel.h"

namespace px {

class Server;
class Session;

ObserverOptions observer_options(const DaemonConfig& config);
ObserverHooks observer_hooks(Server& server);

// Answers one admin request on session (loop thread). Status and the lists are for any peer
// the socket accepts; timeline, checkpoint and drain also need the daemon's own user or
// root, since they write files as the daemon or stop it.
void handle_admin_request(Server& server, const std::shared_ptr<Session>& session,
                          const control::AdminRequest& request);

}  // namespace px
