"""The project's own word lists for the needles' keys ("adjective-noun", RULER's key format).

RULER draws its keys from every adjective-noun pair of wonderwords' lists (about 1,500 adjectives and 6,800
nouns). These lists were written for this project: common English words, lower case, one word each, no hyphen
(a hyphen joins the pair). Over 400 of each give about 180,000 keys; the task draws the keys of one item distinct,
and the distractor needles' keys unlike the item's own (with fewer keys than RULER a clash would be likelier).
"""

from __future__ import annotations

_ADJECTIVES = """
able absent abstract abundant accurate active actual adorable adventurous afraid agile alert alive amber ample
amused ancient angry annual anxious arctic arid aromatic artistic ashamed asleep autumn average awake aware
awkward bad bald bare basic bashful beautiful better big bitter bland blank blazing blind blissful blond blue
blunt bold bored bouncy brave breezy brief bright brilliant brisk broad bronze brown bubbly bulky busy calm
candid capable careful careless casual cautious celestial central certain charming cheap cheerful chilly chosen
chubby circular civil clean clear clever close cloudy clumsy coastal cold colossal comic common compact complex
confident cool copper cosmic costly cozy crafty creamy crimson crisp crooked crowded cruel crystal cubic curious
curly current cute daily damp dapper daring dark dazzling dear decent deep delicate dense desert digital direct
distant divine dizzy double drafty dreamy dry dual dull dusty eager early earnest eastern easy elastic elder
electric elegant empty endless energetic enormous equal exact excited exotic faint fair faithful famous fancy far
fast fearless festive fierce fine firm flat flexible floral fluffy foggy fond formal fragile frank free fresh
friendly frosty frozen funny fuzzy gentle giant gifted gigantic glad gleaming glossy golden good graceful grand
grateful gray great green grumpy hairy handy happy hardy harsh hasty healthy heavy helpful hidden high hollow
honest hopeful horizontal hot huge humble hungry icy ideal idle immense important indigo inner innocent intense
ivory jolly jovial joyful juicy jumpy keen kind known large late lazy lean legal level light likely linear liquid
little lively local lofty lonely long loud lovely loyal lucky lunar magnetic main major mellow merry mighty mild
minor misty modern modest moist musical mutual narrow native natural neat nervous new nice nimble noble noisy
normal northern novel numb odd old olive open orange orderly ordinary organic outer oval pale parallel patient
peaceful perfect personal pink plain plastic pleasant plush polar polite poor popular precious pretty prime
private prompt proper proud public pure purple quick quiet radiant rapid rare raw ready real regular remote rich
right rigid ripe robust rocky romantic rosy rough round royal rural rustic sacred safe salty sandy scarlet secret
serene sharp shiny short shy silent silky silly silver simple sincere slim slow small smart smooth snowy soft
solar solid sour southern spare special spicy splendid square stable steady steep sticky still stormy straight
strange strict striped strong sturdy subtle sudden sunny super sweet swift tall tame tender thick thin tidy tiny
tired total tough tranquil tropical true twin typical ugly unique upper urban usual vague valid vast velvet
vertical violet visible vital vivid warm weary western wet white whole wide wild windy wise witty wooden yellow
young zealous
"""

_NOUNS = """
acorn actor adapter agent airport album alley anchor animal ankle answer apple apron arch arena arm army arrow
artist atlas attic aunt author avenue badge bagel bakery balcony ball balloon bamboo banana band bank barn barrel
basket beach beacon bean bear beard bed bee bell belt bench berry bicycle bird biscuit blanket blossom boat bonnet
book boot bottle boulder bowl box bracelet branch bread brick bridge brook broom brother brush bubble bucket
buffalo building bulb bus butter button cabin cable cactus cake camel camera campus canal candle canoe canyon cap
captain car card carpet carrot castle cat cave cellar chair chalk channel chapel cheese cherry chest chicken
chimney church circle city clock cloud clover coast coat coconut coffee coin comet compass cookie copper coral
corner cottage cotton council country cousin cow crab crane crayon creek cricket crown cup curtain cushion daisy
dancer desk diamond dinner doctor dog doll dolphin donkey door dragon drawer dream drum duck eagle ear earth easel
eel egg elbow elephant engine envelope eraser falcon farm feather fence ferry field finger fire fish flag flame
flower flute fog folder forest fork fountain fox frog garden garlic gate gem ghost giraffe glacier glass glove
goat gold grape grass guitar hall hammer hamster harbor harp hat hawk helmet hen hill hive horse hotel house
island jacket jar jelly jewel journal jungle kettle key kingdom kitchen kite kitten knee knife ladder lake lamp
lantern lawn leaf lemon letter library lighthouse lily lion lizard lobster lock magnet mango map marble market
meadow melon mirror mitten monkey moon mountain mouse muffin museum mushroom needle nest net night notebook ocean
octopus office onion orchard otter owl oyster paddle paint palace panda paper parade parrot path peach peanut pear
pebble pencil penguin pepper piano pigeon pillow pilot pine pizza planet plate plum pocket pond poppy portrait
potato pumpkin puppy puzzle quilt rabbit radio rain rainbow raven ribbon river road robin rocket roof room rope
rose ruby saddle sail salad sand saucer scarf school scissors sea seal seed shadow shark sheep shelf shell ship
shoe shovel sister skate sky sled slipper snail snake sock sofa soup spider sponge spoon squirrel stable stamp
star station statue stone stove street sugar suitcase sun swan sweater table tail teacher teapot telescope tent
theater thread throne thunder tiger toast tomato tower town toy tractor train tree trumpet tulip tunnel turtle
umbrella valley vase violin wagon wall walnut wand watch waterfall wave whale wheel whistle willow window wing
wizard wolf yacht yard zebra
"""

ADJECTIVES: tuple[str, ...] = tuple(sorted(set(_ADJECTIVES.split())))
NOUNS: tuple[str, ...] = tuple(sorted(set(_NOUNS.split())))
