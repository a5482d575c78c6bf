/// The keys of one configuration section: each raw value is the key as the file writes it, and
/// the cases are in the order `check` lists them when a key is unknown. A key's name is written
/// once, here; readers, paths and locations all derive from it.
protocol ConfigKey: RawRepresentable<String>, CaseIterable, Sendable {}
