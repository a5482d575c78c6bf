extension GatewayConfiguration.Store {
    enum Key: String, ConfigKey {
        case redisURL = "redis_url", keyPrefix = "key_prefix", timeout, localCacheTTL = "local_cache_ttl"
        case localCacheEntries = "local_cache_entries", tls, sentinel, cluster, stateDir = "state_dir"
    }

    /// Reads `store`: each key the file sets replaces its default; `tls` and `sentinel` need a
    /// `redis_url` of the right kind.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.string(s, .redisURL) {
            if let url = RedisURL.parse(v) { redisURL = url }
            else { r.report(s, .redisURL, "not a redis URL (redis://[user:password@]host[:port][/db], or rediss:// for TLS)") }
        }
        if let t = r.section(s, .tls, keys: GatewayConfiguration.StoreTLS.Key.self) {
            tls.read(t, r)
            if redisURL?.tls != true {
                r.report(s, .tls, "applies only to a rediss:// store.redis_url; write rediss:// to reach Redis over TLS")
            }
        }
        if let t = r.section(s, .sentinel, keys: GatewayConfiguration.Sentinel.Key.self) {
            sentinel = GatewayConfiguration.Sentinel(t, r)
            if redisURL == nil {
                r.reportMissing(s, .redisURL, "is required with store.sentinel: it gives the scheme, user, password and database of the master (its host is not dialled)")
            }
        }
        if let t = r.section(s, .cluster, keys: GatewayConfiguration.Cluster.Key.self) {
            cluster = GatewayConfiguration.Cluster(t, r)
            if redisURL == nil {
                r.reportMissing(s, .redisURL, "is required with store.cluster: it gives the scheme, user and password of the nodes (its host is not dialled)")
            } else if redisURL?.database != 0 {
                r.report(s, .redisURL, "names database \(redisURL?.database ?? 0); a Redis Cluster has only database 0")
            }
            if s[.sentinel] != nil { r.report(s, .cluster, "and store.sentinel exclude each other: a cluster fails over by itself") }
        }
        if let v = r.string(s, .keyPrefix) {
            if !v.isEmpty, !v.contains(where: { $0.isWhitespace || $0 == "{" || $0 == "}" }) { keyPrefix = v }
            else { r.report(s, .keyPrefix, "must be non-empty, without spaces or braces") }
        }
        if let v = r.duration(s, .timeout) { timeout = v }
        if let v = r.duration(s, .localCacheTTL, atLeast: .zero) { localCacheTTL = v }
        if let v = r.int(s, .localCacheEntries, range: 1...100_000_000) { localCacheEntries = v }
        if let v = r.path(s, .stateDir) { stateDir = v }
    }
}

extension GatewayConfiguration.StoreTLS {
    enum Key: String, ConfigKey {
        case caFile = "ca_file", certificateFile = "certificate_file", privateKeyFile = "private_key_file", serverName = "server_name"
    }

    /// Reads `store.tls`: a client certificate comes with its key.
    mutating func read(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) {
        caFile = r.path(t, .caFile)
        certificateFile = r.path(t, .certificateFile)
        privateKeyFile = r.path(t, .privateKeyFile)
        if (certificateFile == nil) != (privateKeyFile == nil) {
            r.reportMissing(t, certificateFile == nil ? .certificateFile : .privateKeyFile,
                            "is required with store.tls.\(certificateFile == nil ? "private_key_file" : "certificate_file"): a client certificate needs its key")
        }
        if let v = r.string(t, .serverName) {
            if HostName.isValid(v, allowingUnderscore: false) { serverName = v }
            else { r.report(t, .serverName, "'\(v)' is not a host name") }
        }
    }
}

extension GatewayConfiguration.Sentinel {
    enum Key: String, ConfigKey {
        case masterName = "master_name", addresses, password
    }

    /// Reads `store.sentinel`: nil unless it names a master and at least one sentinel.
    init?(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) {
        let name = r.string(t, .masterName)
        if t[.masterName] == nil { r.reportMissing(t, .masterName, "is required (the name in sentinel.conf's 'sentinel monitor')") }
        let addresses = r.list(t, .addresses, what: "host:port of a sentinel (e.g. 10.0.0.1:26379)", parse: { text in
            ListenAddress.parse(text).flatMap { $0.port > 0 ? $0 : nil }
        }) ?? []
        if t[.addresses] == nil || addresses.isEmpty { r.report(t, .addresses, "needs at least one sentinel host:port (three or more in production)") }
        var password: SecretReference? = nil
        if let v = r.string(t, .password) {
            password = SecretReference.parse(v)
            if password == nil { r.report(t, .password, "'\(v)' is not a file path or env:NAME") }
        }
        guard let name, !name.isEmpty, !addresses.isEmpty else { return nil }
        self.init(masterName: name, addresses: addresses)
        self.password = password
    }
}

extension GatewayConfiguration.Cluster {
    enum Key: String, ConfigKey {
        case addresses
    }

    /// Reads `store.cluster`: nil unless it names at least one node.
    init?(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) {
        let addresses = r.list(t, .addresses, what: "host:port of a cluster node (e.g. 10.0.0.1:6379)", parse: { text in
            ListenAddress.parse(text).flatMap { $0.port > 0 ? $0 : nil }
        }) ?? []
        if t[.addresses] == nil || addresses.isEmpty { r.report(t, .addresses, "needs at least one node host:port (a few, so that one down does not matter)") }
        guard !addresses.isEmpty else { return nil }
        self.init(addresses: addresses)
    }
}
