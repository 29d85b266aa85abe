//! Bounded classifications: the [`Label`] trait and the [`label_enum!`](crate::label_enum)
//! macro that defines an enum of them.
//!
//! A classification (a condition reason, a handover operation, a request result) is an enum,
//! not a string. Its variants are written once, with their text; the same list feeds the call
//! sites, the metric series created at start-up and the test that holds `docs/metrics.md` to
//! the code, so none of them can drift from the others.

/// A value of a small, fixed set, with a fixed text (a metric label value, a condition
/// reason or status).
pub trait Label: Copy + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// Every value, in declaration order.
    const ALL: &'static [Self];

    /// The text of this value, exactly as it appears in metrics, conditions and docs.
    fn as_str(self) -> &'static str;
}

/// Defines a [`Label`] enum: `Copy`, `Eq`, `Hash`, `Ord` and `Debug`, with an inherent
/// `ALL` and `as_str()`, the [`Label`] impl and a `Display` that writes the text.
///
/// ```
/// catalogsync::label_enum! {
///     /// Whether a thing worked.
///     pub enum Outcome {
///         /// It worked.
///         Success => "success",
///         /// It did not.
///         Error => "error",
///     }
/// }
/// assert_eq!(Outcome::Error.as_str(), "error");
/// assert_eq!(Outcome::ALL, [Outcome::Success, Outcome::Error]);
/// assert_eq!(Outcome::Success.to_string(), "success");
/// ```
#[macro_export]
macro_rules! label_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The text of this value, exactly as it appears in metrics, conditions and docs.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl $crate::label::Label for $name {
            const ALL: &'static [Self] = $name::ALL;

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Label;

    crate::label_enum! {
        /// Test enum.
        enum Probe {
            /// A.
            A => "a",
            /// B.
            B => "b_value",
        }
    }

    fn texts<L: Label>() -> Vec<&'static str> {
        L::ALL.iter().map(|l| l.as_str()).collect()
    }

    #[test]
    fn all_lists_every_variant_with_its_text() {
        assert_eq!(texts::<Probe>(), ["a", "b_value"]);
        assert_eq!(Probe::B.to_string(), "b_value");
    }
}
