//! Generic English word lists the rules lean on. Nothing here comes from any evaluation data
//! set: only calendar words, a small world gazetteer and common nouns and verbs.

use std::collections::{HashMap, HashSet};

use chrono::Weekday;
use once_cell::sync::Lazy;

/// Month number for a full month name or (when `allow_abbrev`) a common abbreviation.
pub(crate) fn month_of(lower: &str, allow_abbrev: bool) -> Option<u32> {
    let m = match lower {
        "january" => 1,
        "february" => 2,
        "march" => 3,
        "april" => 4,
        "may" => 5,
        "june" => 6,
        "july" => 7,
        "august" => 8,
        "september" => 9,
        "october" => 10,
        "november" => 11,
        "december" => 12,
        _ if !allow_abbrev => return None,
        "jan" => 1,
        "feb" => 2,
        "mar" => 3,
        "apr" => 4,
        "jun" => 6,
        "jul" => 7,
        "aug" => 8,
        "sep" | "sept" => 9,
        "oct" => 10,
        "nov" => 11,
        "dec" => 12,
        _ => return None,
    };
    Some(m)
}

/// Month names that are also ordinary English words and need context to count as months.
pub(crate) fn ambiguous_month(lower: &str) -> bool {
    matches!(lower, "may" | "march" | "august")
}

pub(crate) fn weekday_of(lower: &str) -> Option<Weekday> {
    Some(match lower {
        "monday" => Weekday::Mon,
        "tuesday" => Weekday::Tue,
        "wednesday" => Weekday::Wed,
        "thursday" => Weekday::Thu,
        "friday" => Weekday::Fri,
        "saturday" => Weekday::Sat,
        "sunday" => Weekday::Sun,
        _ => return None,
    })
}

pub(crate) fn is_calendar_word(lower: &str) -> bool {
    month_of(lower, false).is_some() || weekday_of(lower).is_some()
}

/// Capitalised words that start chat sentences but never name anything.
pub(crate) fn is_interjection(lower: &str) -> bool {
    matches!(
        lower,
        "hey"
            | "hi"
            | "hello"
            | "wow"
            | "yeah"
            | "yes"
            | "yep"
            | "yup"
            | "oh"
            | "ok"
            | "okay"
            | "lol"
            | "omg"
            | "thanks"
            | "thank"
            | "thx"
            | "no"
            | "nope"
            | "haha"
            | "hahaha"
            | "bye"
            | "hmm"
            | "um"
            | "uh"
            | "ugh"
            | "aww"
            | "aw"
            | "yay"
            | "btw"
            | "congrats"
            | "congratulations"
            | "sorry"
            | "please"
            | "welcome"
            | "dear"
            | "cheers"
            | "sure"
            | "great"
            | "awesome"
            | "cool"
            | "nice"
            | "amazing"
            | "wonderful"
            | "love"
            | "glad"
            | "happy"
            | "good"
            | "sounds"
            | "looks"
            | "seems"
            | "totally"
            | "absolutely"
            | "exactly"
            | "indeed"
            | "agreed"
            | "right"
            | "true"
            | "alright"
            | "anyway"
            | "well"
            | "so"
            | "also"
            | "oops"
            | "ooh"
            | "whoa"
            | "aha"
            | "yo"
            | "am"
            | "pm"
            | "tv"
            | "gonna"
            | "wanna"
            | "fyi"
            | "imo"
            | "tbh"
            | "idk"
            | "ikr"
    )
}

/// Words that put a following capitalised name in a place ("in Paris", "visited Rome").
pub(crate) fn is_location_cue(lower: &str) -> bool {
    matches!(
        lower,
        "in" | "at"
            | "from"
            | "near"
            | "around"
            | "visited"
            | "visit"
            | "visiting"
            | "visits"
            | "across"
            | "outside"
            | "inside"
            | "towards"
            | "toward"
            | "through"
    )
}

/// Motion words that make "to X" a destination rather than a recipient.
pub(crate) fn is_motion_word(lower: &str) -> bool {
    matches!(
        lower,
        "go" | "goes"
            | "going"
            | "went"
            | "gone"
            | "move"
            | "moved"
            | "moving"
            | "moves"
            | "travel"
            | "traveled"
            | "travelled"
            | "traveling"
            | "travelling"
            | "fly"
            | "flew"
            | "flying"
            | "flown"
            | "drive"
            | "drove"
            | "driving"
            | "driven"
            | "trip"
            | "vacation"
            | "holiday"
            | "headed"
            | "heading"
            | "head"
            | "way"
            | "back"
            | "came"
            | "come"
            | "coming"
            | "return"
            | "returned"
            | "returning"
            | "relocate"
            | "relocated"
            | "walk"
            | "walked"
            | "walking"
            | "ride"
            | "rode"
            | "sail"
            | "sailed"
            | "road"
            | "journey"
            | "get"
            | "got"
            | "arrived"
            | "welcome"
    )
}

/// Generic nouns for places; a turn that mentions one is about being somewhere.
#[rustfmt::skip]
static PLACE_NOUNS: &[&str] = &[
    "beach", "park", "museum", "restaurant", "gym", "school", "church", "mountains", "mountain",
    "lake", "city", "office", "hospital", "library", "cafe", "café", "bar", "pub", "zoo", "mall",
    "store", "shop", "supermarket", "market", "theater", "theatre", "cinema", "stadium",
    "airport", "station", "hotel", "campus", "university", "college", "studio", "gallery",
    "temple", "mosque", "synagogue", "garden", "forest", "woods", "river", "ocean", "sea",
    "island", "desert", "countryside", "village", "town", "downtown", "neighborhood",
    "neighbourhood", "club", "farm", "campground", "campsite", "trail", "coast", "shelter",
    "clinic", "bakery", "salon", "spa", "pool", "arena", "concert", "festival", "aquarium",
    "playground", "lab", "laboratory", "factory", "warehouse", "cabin", "cottage", "resort",
    "canyon", "valley", "waterfall", "harbor", "harbour", "pier", "boardwalk", "stadium",
    "courthouse", "embassy", "bookstore", "brewery", "winery", "vineyard", "hostel", "motel",
    "kitchen", "backyard", "yard", "classroom", "church", "cathedral", "chapel", "castle",
    "palace", "monument", "square", "plaza", "highway", "bridge", "dock", "marina", "orchard",
];

static PLACE_SET: Lazy<HashSet<&'static str>> = Lazy::new(|| PLACE_NOUNS.iter().copied().collect());

pub(crate) fn is_place_noun(lower: &str) -> bool {
    PLACE_SET.contains(lower)
}

/// Verbs that introduce an event worth tracking, surface form → lemma.
static EVENT_VERBS: &[(&str, &[&str])] = &[
    ("go", &["go", "goes", "going", "went", "gone"]),
    ("visit", &["visit", "visits", "visiting", "visited"]),
    ("adopt", &["adopt", "adopts", "adopting", "adopted"]),
    ("start", &["start", "starts", "starting", "started"]),
    ("begin", &["begin", "begins", "beginning", "began", "begun"]),
    ("join", &["join", "joins", "joining", "joined"]),
    ("paint", &["paint", "paints", "painted"]),
    ("draw", &["draw", "draws", "drew", "drawn"]),
    ("run", &["run", "runs", "running", "ran"]),
    ("attend", &["attend", "attends", "attending", "attended"]),
    ("buy", &["buy", "buys", "buying", "bought"]),
    ("move", &["move", "moves", "moving", "moved"]),
    ("take", &["take", "takes", "taking", "took", "taken"]),
    ("make", &["make", "makes", "making", "made"]),
    ("play", &["play", "plays", "playing", "played"]),
    ("watch", &["watch", "watches", "watching", "watched"]),
    ("read", &["read", "reads", "reading"]),
    ("write", &["write", "writes", "writing", "wrote", "written"]),
    ("cook", &["cook", "cooks", "cooking", "cooked"]),
    ("bake", &["bake", "bakes", "baking", "baked"]),
    (
        "learn",
        &["learn", "learns", "learning", "learned", "learnt"],
    ),
    ("finish", &["finish", "finishes", "finishing", "finished"]),
    (
        "complete",
        &["complete", "completes", "completing", "completed"],
    ),
    (
        "travel",
        &[
            "travel",
            "travels",
            "traveling",
            "travelling",
            "traveled",
            "travelled",
        ],
    ),
    ("hike", &["hike", "hikes", "hiking", "hiked"]),
    ("camp", &["camp", "camps", "camped"]),
    (
        "volunteer",
        &["volunteer", "volunteers", "volunteering", "volunteered"],
    ),
    (
        "celebrate",
        &["celebrate", "celebrates", "celebrating", "celebrated"],
    ),
    (
        "graduate",
        &["graduate", "graduates", "graduating", "graduated"],
    ),
    ("meet", &["meet", "meets", "meeting", "met"]),
    ("open", &["open", "opens", "opened"]),
    ("launch", &["launch", "launches", "launching", "launched"]),
    ("build", &["build", "builds", "building", "built"]),
    ("create", &["create", "creates", "creating", "created"]),
    ("teach", &["teach", "teaches", "teaching", "taught"]),
    ("win", &["win", "wins", "winning", "won"]),
    (
        "perform",
        &["perform", "performs", "performing", "performed"],
    ),
    ("host", &["host", "hosts", "hosting", "hosted"]),
    (
        "organize",
        &[
            "organize",
            "organizes",
            "organizing",
            "organized",
            "organise",
            "organised",
            "organising",
        ],
    ),
    ("plan", &["plan", "plans", "planning", "planned"]),
    ("study", &["study", "studies", "studying", "studied"]),
    (
        "practice",
        &[
            "practice",
            "practices",
            "practicing",
            "practiced",
            "practise",
            "practising",
            "practised",
        ],
    ),
    ("train", &["train", "trains", "training", "trained"]),
    ("quit", &["quit", "quits", "quitting"]),
    ("return", &["return", "returns", "returning", "returned"]),
    ("throw", &["throw", "throws", "throwing", "threw", "thrown"]),
    ("receive", &["receive", "receives", "receiving", "received"]),
    ("sign", &["sign", "signs", "signing", "signed"]),
    (
        "enroll",
        &[
            "enroll",
            "enrolls",
            "enrolled",
            "enrolling",
            "enrol",
            "enrolled",
        ],
    ),
    ("fly", &["fly", "flies", "flying", "flew", "flown"]),
    ("drive", &["drive", "drives", "driving", "drove", "driven"]),
    ("see", &["see", "sees", "seeing", "saw", "seen"]),
    ("lose", &["lose", "loses", "losing", "lost"]),
    ("get", &["got", "gotten"]),
    ("celebrate", &["celebrate"]),
    ("record", &["record", "records", "recording", "recorded"]),
    (
        "publish",
        &["publish", "publishes", "publishing", "published"],
    ),
    ("donate", &["donate", "donates", "donating", "donated"]),
    ("rescue", &["rescue", "rescues", "rescuing", "rescued"]),
    ("visit", &["tour", "toured", "touring"]),
];

static EVENT_MAP: Lazy<HashMap<&'static str, &'static str>> = Lazy::new(|| {
    let mut m = HashMap::new();
    for (lemma, forms) in EVENT_VERBS {
        for f in *forms {
            m.entry(*f).or_insert(*lemma);
        }
    }
    m
});

pub(crate) fn event_lemma(lower: &str) -> Option<&'static str> {
    EVENT_MAP.get(lower).copied()
}

/// Continents, countries, US states and major world cities, lower case.
#[rustfmt::skip]
static GAZETTEER: &[&str] = &[
    // continents and regions
    "africa", "antarctica", "asia", "australia", "europe", "north america", "south america",
    "central america", "latin america", "middle east", "caribbean", "scandinavia", "oceania",
    "the balkans", "southeast asia", "east asia", "the alps",
    // countries
    "afghanistan", "albania", "algeria", "andorra", "angola", "argentina", "armenia", "austria",
    "azerbaijan", "bahamas", "bahrain", "bangladesh", "barbados", "belarus", "belgium", "belize",
    "benin", "bhutan", "bolivia", "bosnia", "botswana", "brazil", "brunei", "bulgaria",
    "burkina faso", "burundi", "cambodia", "cameroon", "canada", "cape verde", "chile", "china",
    "colombia", "congo", "costa rica", "croatia", "cuba", "cyprus", "czech republic", "czechia",
    "denmark", "djibouti", "dominican republic", "ecuador", "egypt", "el salvador", "england",
    "eritrea", "estonia", "ethiopia", "fiji", "finland", "france", "gabon", "gambia", "georgia",
    "germany", "ghana", "greece", "greenland", "guatemala", "guinea", "guyana", "haiti",
    "honduras", "hungary", "iceland", "india", "indonesia", "iran", "iraq", "ireland", "israel",
    "italy", "ivory coast", "jamaica", "japan", "jordan", "kazakhstan", "kenya", "korea",
    "south korea", "north korea", "kosovo", "kuwait", "kyrgyzstan", "laos", "latvia", "lebanon",
    "liberia", "libya", "liechtenstein", "lithuania", "luxembourg", "madagascar", "malawi",
    "malaysia", "maldives", "mali", "malta", "mauritius", "mexico", "moldova", "monaco",
    "mongolia", "montenegro", "morocco", "mozambique", "myanmar", "namibia", "nepal",
    "netherlands", "holland", "new zealand", "nicaragua", "niger", "nigeria", "north macedonia",
    "norway", "oman", "pakistan", "palestine", "panama", "papua new guinea", "paraguay", "peru",
    "philippines", "poland", "portugal", "puerto rico", "qatar", "romania", "russia", "rwanda",
    "saudi arabia", "scotland", "senegal", "serbia", "seychelles", "sierra leone", "singapore",
    "slovakia", "slovenia", "somalia", "south africa", "south sudan", "spain", "sri lanka",
    "sudan", "suriname", "sweden", "switzerland", "syria", "taiwan", "tajikistan", "tanzania",
    "thailand", "togo", "tonga", "trinidad", "tunisia", "turkey", "turkmenistan", "uganda",
    "ukraine", "united arab emirates", "uae", "united kingdom", "uk", "britain", "great britain",
    "united states", "usa", "us", "america", "uruguay", "uzbekistan", "vatican", "venezuela",
    "vietnam", "wales", "yemen", "zambia", "zimbabwe",
    // US states
    "alabama", "alaska", "arizona", "arkansas", "california", "colorado", "connecticut",
    "delaware", "florida", "hawaii", "idaho", "illinois", "indiana", "iowa", "kansas", "kentucky",
    "louisiana", "maine", "maryland", "massachusetts", "michigan", "minnesota", "mississippi",
    "missouri", "montana", "nebraska", "nevada", "new hampshire", "new jersey", "new mexico",
    "new york", "north carolina", "north dakota", "ohio", "oklahoma", "oregon", "pennsylvania",
    "rhode island", "south carolina", "south dakota", "tennessee", "texas", "utah", "vermont",
    "virginia", "washington", "west virginia", "wisconsin", "wyoming",
    // major cities
    "new york city", "nyc", "los angeles", "la", "chicago", "houston", "philadelphia",
    "san antonio", "san diego", "dallas", "san jose", "austin", "san francisco", "seattle",
    "denver", "boston", "las vegas", "portland", "miami", "atlanta", "detroit", "nashville",
    "new orleans", "minneapolis", "pittsburgh", "baltimore", "cleveland", "orlando", "phoenix",
    "salt lake city", "honolulu", "washington dc", "dc", "toronto", "vancouver", "montreal",
    "ottawa", "calgary", "mexico city", "havana", "london", "paris", "berlin", "madrid",
    "barcelona", "rome", "milan", "venice", "florence", "naples", "lisbon", "porto", "amsterdam",
    "brussels", "vienna", "prague", "budapest", "warsaw", "krakow", "munich", "hamburg",
    "frankfurt", "zurich", "geneva", "copenhagen", "stockholm", "oslo", "helsinki", "dublin",
    "edinburgh", "glasgow", "manchester", "liverpool", "athens", "istanbul", "moscow",
    "saint petersburg", "kyiv", "kiev", "dubai", "abu dhabi", "jerusalem", "tel aviv", "cairo",
    "marrakech", "casablanca", "nairobi", "lagos", "cape town", "johannesburg", "mumbai", "delhi",
    "new delhi", "bangalore", "kolkata", "chennai", "karachi", "lahore", "dhaka", "kathmandu",
    "bangkok", "hanoi", "ho chi minh city", "singapore city", "kuala lumpur", "jakarta", "bali",
    "manila", "hong kong", "beijing", "shanghai", "shenzhen", "seoul", "busan", "tokyo", "kyoto",
    "osaka", "taipei", "sydney", "melbourne", "brisbane", "perth", "auckland", "wellington",
    "rio de janeiro", "rio", "sao paulo", "buenos aires", "santiago", "lima", "bogota", "quito",
    "caracas", "montevideo", "reykjavik", "tuscany", "sicily", "hawaii",
];

/// Gazetteer entries that are also common first names or common nouns: only counted with a
/// place cue ("in Jordan") and a capital letter.
pub(crate) fn ambiguous_place(lower: &str) -> bool {
    matches!(
        lower,
        "georgia"
            | "jordan"
            | "turkey"
            | "china"
            | "chad"
            | "india"
            | "israel"
            | "virginia"
            | "washington"
            | "austin"
            | "dallas"
            | "orlando"
            | "phoenix"
            | "florence"
            | "sydney"
            | "perth"
            | "lima"
            | "santiago"
            | "rio"
            | "la"
            | "us"
            | "dc"
            | "niger"
            | "guinea"
            | "mali"
            | "maine"
            | "nevada"
            | "chile"
            | "cuba"
            | "victoria"
            | "georgia's"
            | "kent"
            | "bali"
            | "denver"
            | "portland"
            | "wales"
    )
}

/// First word → the gazetteer entries (as word lists) starting with it, longest first.
static GAZ_INDEX: Lazy<HashMap<&'static str, Vec<Vec<&'static str>>>> = Lazy::new(|| {
    let mut m: HashMap<&'static str, Vec<Vec<&'static str>>> = HashMap::new();
    for entry in GAZETTEER {
        let words: Vec<&'static str> = entry.split(' ').collect();
        m.entry(words[0]).or_default().push(words);
    }
    for v in m.values_mut() {
        v.sort_by_key(|w| std::cmp::Reverse(w.len()));
        v.dedup();
    }
    m
});

/// Longest gazetteer entry starting at `words[0]`, as a number of words.
pub(crate) fn gazetteer_match<'a>(mut next: impl FnMut(usize) -> Option<&'a str>) -> usize {
    let Some(first) = next(0) else { return 0 };
    let Some(cands) = GAZ_INDEX.get(first) else {
        return 0;
    };
    'outer: for cand in cands {
        for (k, w) in cand.iter().enumerate().skip(1) {
            if next(k) != Some(*w) {
                continue 'outer;
            }
        }
        return cand.len();
    }
    0
}

/// Whether a whole lower-case phrase is a gazetteer place.
pub(crate) fn is_gazetteer_place(lower: &str) -> bool {
    let words: Vec<&str> = lower.split_whitespace().collect();
    !words.is_empty() && gazetteer_match(|k| words.get(k).copied()) == words.len()
}
