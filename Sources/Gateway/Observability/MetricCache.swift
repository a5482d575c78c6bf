import NIOConcurrencyHelpers

/// Metric objects made once per key, behind a lock: the registry exports a series once it is
/// made, so each is made on first use (or when primed) and found again by its key.
struct MetricCache<Key: Hashable & Sendable, Metric: Sendable>: Sendable {
    private let box = NIOLockedValueBox<[Key: Metric]>([:])

    /// The metric for `key`, made by `make` the first time.
    func callAsFunction(_ key: Key, make: () -> Metric) -> Metric {
        box.withLockedValue { cache in
            if let metric = cache[key] { return metric }
            let metric = make()
            cache[key] = metric
            return metric
        }
    }
}

/// One series of a family: the family's name and its label pairs, in order (the key of a
/// cached metric; labels are part of it, so two families never share an entry).
struct MetricSeries: Hashable, Sendable {
    let metric: String
    private let labelPairs: [[String]]

    init(_ metric: String, _ labels: [(String, String)]) {
        self.metric = metric
        self.labelPairs = labels.map { [$0.0, $0.1] }
    }
}
