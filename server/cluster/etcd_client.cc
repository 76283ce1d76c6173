#include "server/cluster/etcd_client.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {
namespace {

constexpr std::array<std::string_view, 2> kSchemes = {"http://", "https://"};

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* setting) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("etcd ", setting, " '", path, "': cannot be read"));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", setting, " '", path, "': not a PEM file"));
  }
  return text;
}

// The channel's credentials: plain for http, TLS (mutual where a certificate is given) for
// https.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const EtcdOptions& options, bool tls) {
  if (!tls) {
    if (!options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError("etcd: TLS files are given but the endpoints are http://");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.ca_file.empty()) {
    return absl::InvalidArgumentError("etcd: https:// endpoints need the CA file that signed etcd's certificate");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("etcd: a client certificate needs both its certificate and key files");
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadPem(options.ca_file, "CA file");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (!options.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(options.cert_file, "certificate file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(options.key_file, "key file");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

// grpc::Status to absl::Status (the codes share their numbers), naming etcd and what was
// asked of it.
absl::Status Failed(const grpc::Status& status, const std::string& etcd, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(etcd, ": ", what, ": ", status.error_message()));
}

std::string Quoted(std::string_view key) {
  std::string quoted;
  quoted.reserve(key.size() + 2);
  quoted.append("'").append(key).append("'");
  return quoted;
}

}  // namespace

EtcdKeyValue ToEtcdKeyValue(const mvccpb::KeyValue& kv) {
  return EtcdKeyValue{.key = kv.key(),
                      .value = kv.value(),
                      .create_revision = kv.create_revision(),
                      .mod_revision = kv.mod_revision(),
                      .version = kv.version(),
                      .lease = kv.lease()};
}

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
  std::optional<bool> tls;
  for (const std::string& endpoint : options.endpoints) {
    const auto scheme = std::find_if(kSchemes.begin(), kSchemes.end(),
                                     [&](std::string_view s) { return endpoint.starts_with(s); });
    if (scheme == kSchemes.end() || endpoint.size() == scheme->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", endpoint, "': expected http://HOST:PORT or https://HOST:PORT"));
    }
    const bool https = scheme == kSchemes.begin() + 1;
    if (tls.has_value() && *tls != https) {
      return absl::InvalidArgumentError("etcd: the endpoints mix http:// and https://");
    }
    tls = https;
    addresses.push_back(endpoint.substr(scheme->size()));
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd: the call timeout must be positive");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = Credentials(options, *tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s, and calls fail at once meanwhile: an
  // etcd back after a restart would stay unused for minutes. Try again at least every second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  // A member that stops answering (frozen, or the path to it cut) while a watch is open
  // would hold the watch forever: pings find it within 15 s. Only while calls are open,
  // and no more often than etcd allows (--grpc-keepalive-min-time, 5 s by default).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // a quiet watch carries no data
  // No transparent retries: every call has its deadline and the callers retry themselves;
  // and gRPC 1.51's retry filter aborts the process (an assertion, grpc/grpc#34683) when
  // a stream ends with trailers that hold no status, as a watch stream does when etcd
  // shuts down.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  std::vector<Member> members;
  for (size_t i = 0; i < addresses.size(); ++i) {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(addresses[i], *credentials, args);
    members.push_back(Member{.endpoint = options.endpoints[i],
                             .channel = channel,
                             .kv = etcdserverpb::KV::NewStub(channel),
                             .lease = etcdserverpb::Lease::NewStub(channel)});
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(members)));
}

EtcdClient::EtcdClient(EtcdOptions options, std::vector<Member> members)
    : options_(std::move(options)),
      description_(absl::StrCat("etcd at ", absl::StrJoin(options_.endpoints, ","))),
      members_(std::move(members)) {}

EtcdClient::~EtcdClient() = default;

std::shared_ptr<grpc::Channel> EtcdClient::channel() const {
  return members_[current_.load(std::memory_order_relaxed)].channel;
}

const std::string& EtcdClient::current_endpoint() const {
  return members_[current_.load(std::memory_order_relaxed)].endpoint;
}

bool EtcdClient::NoAnswer(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

void EtcdClient::Unanswered(const grpc::Channel* channel) {
  if (members_.size() < 2) return;
  size_t current = current_.load();
  if (members_[current].channel.get() != channel) return;  // moved on already
  const size_t next = (current + 1) % members_.size();
  if (current_.compare_exchange_strong(current, next)) {
    spdlog::warn("{}: {} did not answer; calls go to {} now", description_, members_[current].endpoint,
                 members_[next].endpoint);
  }
}

template <typename Call>
grpc::Status EtcdClient::OnMember(Retry retry, Call&& call) {
  grpc::Status status;
  for (size_t tried = 0; tried < members_.size(); ++tried) {
    Member& member = members_[current_.load()];
    auto context = NewContext();
    status = call(member, context.get());
    if (!NoAnswer(status)) return status;
    Unanswered(member.channel.get());
    // Only a member that could not be reached is passed over at once: one that ran out of
    // time has taken the caller's deadline already.
    if (retry == Retry::kNo || status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  return status;
}

std::unique_ptr<grpc::ClientContext> EtcdClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  // Not wait_for_ready: an etcd that cannot be reached, or refuses the TLS handshake, fails
  // the call at once with UNAVAILABLE and gRPC's reason, instead of a bare deadline later.
  return context;
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) {
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::RangeResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Range(context, request, &response);
  });
  if (!status.ok()) return Failed(status, description_, absl::StrCat("get ", Quoted(key)));
  if (response.kvs_size() == 0) return std::nullopt;
  return ToEtcdKeyValue(response.kvs(0));
}

absl::StatusOr<EtcdRange> EtcdClient::GetPrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("etcd: a prefix read needs a prefix");
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::RangeResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Range(context, request, &response);
  });
  if (!status.ok()) return Failed(status, description_, absl::StrCat("list ", Quoted(prefix)));
  EtcdRange range;
  range.revision = response.header().revision();
  range.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) range.kvs.push_back(ToEtcdKeyValue(kv));
  return range;
}

absl::StatusOr<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Put(context, request, &response);
  });
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
  grpc::Status status = OnMember(Retry::kNo, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Txn(context, request, &response);
  });
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
  grpc::Status status = OnMember(Retry::kNo, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Txn(context, request, &response);
  });
  if (!status.ok()) {
    return Failed(status, description_, absl::StrCat("delete ", Quoted(key), " at revision ", mod_revision));
  }
  if (!response.succeeded() || response.responses_size() == 0) return std::nullopt;
  const etcdserverpb::DeleteRangeResponse& deleted = response.responses(0).response_delete_range();
  if (deleted.prev_kvs_size() == 0) return std::nullopt;
  return ToEtcdKeyValue(deleted.prev_kvs(0));
}

absl::StatusOr<int64_t> EtcdClient::Delete(std::string_view key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::DeleteRangeResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->DeleteRange(context, request, &response);
  });
  if (!status.ok()) return Failed(status, description_, absl::StrCat("delete ", Quoted(key)));
  return response.deleted();
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("etcd: a prefix delete needs a prefix");
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::DeleteRangeResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->DeleteRange(context, request, &response);
  });
  if (!status.ok()) return Failed(status, description_, absl::StrCat("delete every key under ", Quoted(prefix)));
  return response.deleted();
}

absl::Status EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  etcdserverpb::CompactionResponse response;
  grpc::Status status = OnMember(Retry::kNo, [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Compact(context, request, &response);
  });
  if (!status.ok()) return Failed(status, description_, absl::StrCat("compact to revision ", revision));
  return absl::OkStatus();
}

absl::StatusOr<EtcdLeaseGrant> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(seconds);
  etcdserverpb::LeaseGrantResponse response;
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.lease->LeaseGrant(context, request, &response);
  });
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
  grpc::Status status = OnMember(Retry::kOnNextMember, [&](Member& member, grpc::ClientContext* context) {
    return member.lease->LeaseRevoke(context, request, &response);
  });
  // etcd answers NOT_FOUND ("requested lease not found") for a lease already gone.
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return absl::OkStatus();
  if (!status.ok()) return Failed(status, description_, absl::StrCat("revoke lease ", absl::Hex(id)));
  return absl::OkStatus();
}

}  // namespace tensord::server::cluster
