/// Every operation of `SessionStore`, as the `operation` label of
/// `sessiongate_store_duration_seconds`. `GatewayStore` names one case per protocol method, and
/// the metrics are primed from `allCases`: an operation cannot go unmeasured or unlisted.
enum StoreOperation: String, CaseIterable, Sendable {
    case create, load, touch, delete, sessions, revoke, end
    case saveProfile = "save_profile", profile
    case putLogin = "put_login", takeLogin = "take_login"
    case putNonce = "put_nonce", takeNonce = "take_nonce"
    case claim, release
    case saveRefreshToken = "save_refresh_token", refreshTokens = "refresh_tokens"
    case putJob = "put_job", jobs, job, removeJob = "remove_job"
    case validation, recordValidation = "record_validation", markValidated = "mark_validated"
    case link, unlink, account
    case users
    case putTransfer = "put_transfer", transfer, transfers
    case returnURL = "return_url"
    case ping

    /// Walks the whole keyspace (SCAN, one round trip per thousand keys): as long as the store
    /// is large. Each round trip is bounded by the Redis command timeout, the walk by nothing.
    var walksKeyspace: Bool {
        switch self {
        case .users, .transfers: true
        default: false
        }
    }
}
