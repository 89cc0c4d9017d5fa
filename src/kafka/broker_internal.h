// Broker internals shared by broker.cc (data and admin APIs) and
// broker_groups.cc (consumer groups). Not part of the module's interface.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "base/log.h"
#include "kafka/api_table.h"
#include "kafka/broker.h"

namespace weir::kafka {

// One decoded request in flight. Made by Broker::Handle on the I/O thread and
// shared (shared_ptr) by the work and callbacks that answer it. Decoded views
// (Produce records) point into `frame`, so the request keeps it.
struct Broker::Request {
  Frame frame;
  DecodedRequest decoded;
  std::shared_ptr<Reply> reply;

  int16_t version() const { return decoded.header.api_version; }
  template <typename T>
  T& body() {
    return std::get<T>(decoded.body);
  }
};

// Encodes header + body with `encode` and answers; an encoder failure (a value
// the version cannot carry) closes the connection.
template <typename Response, typename Encoder>
void Send(const std::shared_ptr<Broker::Request>& req, const Response& resp, Encoder encode) {
  std::string out;
  Writer w(&out);
  EncodeResponseHeader(req->decoded.header.correlation_id, w);
  encode(resp, req->version(), w);
  if (!w.ok()) {
    Log().error("kafka: encoding a response to {}: {}", req->reply->peer(), w.status().ToString());
    return req->reply->Close();
  }
  req->reply->Respond(std::move(out));
}

}  // namespace weir::kafka
