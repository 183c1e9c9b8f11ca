// pxctl's views of the daemon's admin replies (control.fbs: AdminReply): each item as a JSON
// object (--json) and as lines of the human-readable output.
#pragma once

#include <string>

#include "control_generated.h"
#include "tools/pxctl/output.h"

namespace pxctl {

std::string status_json(const px::control::AdminStatus& s);
std::string status_text(const px::control::AdminStatus& s);

std::string job_json(const px::control::AdminJob& j);
void job_row(Table& table, const px::control::AdminJob& j);
std::string job_notes(const px::control::AdminJob& j);  // broken reasons, below the table

std::string variable_json(const px::control::AdminVariable& v);
void variable_row(Table& table, const px::control::AdminVariable& v);

std::string peer_json(const px::control::AdminPeer& p);
void peer_row(Table& table, const px::control::AdminPeer& p);

std::string stall_json(const px::control::AdminStall& s);
std::string stall_text(const px::control::AdminStall& s);

Table job_table();
Table variable_table();
Table peer_table();

}  // namespace pxctl
