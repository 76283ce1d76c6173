#include "server/cluster/etcd_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"

namespace tensord::server::cluster {
namespace {

constexpr char kHttp[] = "http://";
constexpr size_t kHttpSize = sizeof(kHttp) - 1;

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  return EtcdKeyValue{.key = kv.key(),
                      .value = kv.value(),
                      .create_revision = kv.create_revision(),
                      .mod_revision = kv.mod_revision(),
                      .version = kv.version(),
                      .lease = kv.lease()};
}

// grpc::Status to absl::Status (the codes share their numbers), naming etcd and what was
// asked of it.
absl::Status Failed(const grpc::Status& status, const std::string& etcd, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(etcd, ": ", what, ": ", status.error_message()));
}

std::string Quoted(std::string_view key) { return "'" + std::string(key) + "'"; }

}  // namespace

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  // Every byte 0xff: no key above the prefix bounds it; "\0" means "to the end".
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoint given");
  std::vector<std::string> addresses;
  for (const std::string& endpoint : options.endpoints) {
    if (absl::StartsWith(endpoint, "https://")) {
      return absl::UnimplementedError(
          absl::StrCat("etcd endpoint ", endpoint, ": TLS to etcd is not built yet; use http://"));
    }
    if (!absl::StartsWith(endpoint, kHttp) || endpoint.size() == kHttpSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", endpoint, "': expected http://HOST:PORT"));
    }
    addresses.push_back(endpoint.substr(kHttpSize));
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd: the call timeout must be positive");
  }
  // Several endpoints: one channel over all of them (ipv4:/ipv6: lists), round robin, so a
  // dead member costs a retry, not an outage.
  std::string target = addresses.size() == 1 ? addresses.front() : absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  grpc::ChannelArguments args;
  if (addresses.size() > 1) args.SetLoadBalancingPolicyName("round_robin");
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(channel)));
}

EtcdClient::EtcdClient(EtcdOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      description_(absl::StrCat("etcd at ", absl::StrJoin(options_.endpoints, ","))),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)) {}

EtcdClient::~EtcdClient() = default;

std::unique_ptr<grpc::ClientContext> EtcdClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  // A restarting etcd is waited for up to the deadline instead of failing the call at once.
  context->set_wait_for_ready(true);
  return context;
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) {
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::RangeResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Range(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("get ", Quoted(key)));
  if (response.kvs_size() == 0) return std::nullopt;
  return FromProto(response.kvs(0));
}

absl::StatusOr<EtcdRange> EtcdClient::GetPrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("etcd: a prefix read needs a prefix");
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::RangeResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Range(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("list ", Quoted(prefix)));
  EtcdRange range;
  range.revision = response.header().revision();
  range.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) range.kvs.push_back(FromProto(kv));
  return range;
}

absl::StatusOr<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Put(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("put ", Quoted(key)));
  return response.header().revision();
}

absl::StatusOr<bool> EtcdClient::PutIfAbsent(std::string_view key, std::string_view value, int64_t lease) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(std::string(key));
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);  // a key that does not exist has create_revision 0
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  etcdserverpb::TxnResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Txn(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("put if absent ", Quoted(key)));
  return response.succeeded();
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::DeleteIfRevision(std::string_view key, int64_t mod_revision) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* unchanged = request.add_compare();
  unchanged->set_key(std::string(key));
  unchanged->set_target(etcdserverpb::Compare::MOD);
  unchanged->set_result(etcdserverpb::Compare::EQUAL);
  unchanged->set_mod_revision(mod_revision);
  etcdserverpb::DeleteRangeRequest* remove = request.add_success()->mutable_request_delete_range();
  remove->set_key(std::string(key));
  remove->set_prev_kv(true);
  etcdserverpb::TxnResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Txn(context.get(), request, &response);
  if (!status.ok()) {
    return Failed(status, description_, absl::StrCat("delete ", Quoted(key), " at revision ", mod_revision));
  }
  if (!response.succeeded() || response.responses_size() == 0) return std::nullopt;
  const etcdserverpb::DeleteRangeResponse& deleted = response.responses(0).response_delete_range();
  if (deleted.prev_kvs_size() == 0) return std::nullopt;
  return FromProto(deleted.prev_kvs(0));
}

absl::StatusOr<int64_t> EtcdClient::Delete(std::string_view key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::DeleteRangeResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->DeleteRange(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("delete ", Quoted(key)));
  return response.deleted();
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("etcd: a prefix delete needs a prefix");
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::DeleteRangeResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->DeleteRange(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("delete every key under ", Quoted(prefix)));
  return response.deleted();
}

absl::Status EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  etcdserverpb::CompactionResponse response;
  auto context = NewContext();
  grpc::Status status = kv_->Compact(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("compact to revision ", revision));
  return absl::OkStatus();
}

absl::StatusOr<EtcdLeaseGrant> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(seconds);
  etcdserverpb::LeaseGrantResponse response;
  auto context = NewContext();
  grpc::Status status = lease_->LeaseGrant(context.get(), request, &response);
  if (!status.ok()) return Failed(status, description_, absl::StrCat("grant a lease of ", seconds, " s"));
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat(description_, ": grant a lease of ", seconds, " s: ", response.error()));
  }
  return EtcdLeaseGrant{.id = response.id(), .ttl = absl::Seconds(response.ttl())};
}

absl::Status EtcdClient::RevokeLease(int64_t id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  auto context = NewContext();
  grpc::Status status = lease_->LeaseRevoke(context.get(), request, &response);
  // etcd answers NOT_FOUND ("requested lease not found") for a lease already gone.
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return absl::OkStatus();
  if (!status.ok()) return Failed(status, description_, absl::StrCat("revoke lease ", absl::Hex(id)));
  return absl::OkStatus();
}

}  // namespace tensord::server::cluster
